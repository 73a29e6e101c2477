"""Launchers for external engines: presets rendered as TensorRT-LLM, vLLM or SGLang plans.

``serve`` turns a ``mathagent serve`` request into a :class:`~.plan.LaunchPlan`; ``process``
runs any server (the embedded one included) as a child process with a health check.
"""
