"""The consumer runtime: a consumer's declaration, the worker loop, the retry policy, the counters, the dead-letter writer.

What runs a consumer, whatever its queue: ``consumer`` (what a service declares), ``worker``
(the loop behind ``core-jobs worker``), ``retry`` (the policy and its worst case, J-B7),
``metrics`` (what is counted; nothing by default) and ``dead_letters`` (the row written when the
harness gives up on a job, J-B4). docs/harness.md.
"""
