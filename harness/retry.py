"""Deprecated: ``harness.retry`` moved to ``harness.consumer.retry``; this shim goes in the next minor version.

Importing it warns and hands back the module at its new home, so the names are the very same objects.
"""

from harness.consumer import replace_moved_module, retry

replace_moved_module(__name__, retry)
