"""Drafter training (ReDrafter): its own runner and cache, data, loss, distillation, training.

``base`` runs the frozen base on a runner and KV cache of its own, ``data`` turns text into the
training table, ``loss`` scores drafts, ``distill`` has the base write training text, ``train``
fits the drafter, ``pipeline`` is what ``mathagent train-drafter`` runs. This package imports
the inference engine (its model, runner and the drafter module it drafts with); the engine
never imports it.
"""
