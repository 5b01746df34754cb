"""The verifier: sandboxed Python execution, the three AZR task families, rewards and program metrics.

Pure Python (no Ray). ``from verifier import Verifier, Status`` is the execution contract.
"""

from verifier.prompts import Answer, Proposal, parse_answer, parse_proposal, student_prompt, teacher_prompt
from verifier.sandbox import ExecResult, Status, Verifier
from verifier.tasks import FAMILIES, Task, identity_task

__all__ = [
    "FAMILIES",
    "Answer",
    "ExecResult",
    "Proposal",
    "Status",
    "Task",
    "Verifier",
    "identity_task",
    "parse_answer",
    "parse_proposal",
    "student_prompt",
    "teacher_prompt",
]
