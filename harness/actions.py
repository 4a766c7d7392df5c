"""Deprecated: ``harness.actions`` moved to ``harness.consumer.actions``; this shim goes in the next minor version.

Importing it warns and hands back the module at its new home, so the names are the very same objects.
"""

from harness.consumer import actions, replace_moved_module

replace_moved_module(__name__, actions)
