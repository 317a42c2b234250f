"""Optional integrations of the worker SDK with the trainers people already use.

`reconciler.worker.integrations.lightning` (extra `lightning`) and
`reconciler.worker.integrations.huggingface` (extra `huggingface`) each hold a callback; import the
one you need, the other trainer is never imported.
"""
