"""Tool-integrated reasoning: prompts, code-tag formats, the loop, answer extraction, /solve."""
