"""The verifier: sandboxed Python execution, the three AZR task families, prompts and program metrics (what a
verdict is worth is the game's: ``rollouts.rewards``).

Pure Python (no Ray). ``from verifier import Verifier, Status`` is the execution contract.
"""

from verifier.buffers import TaskBuffer, make_buffers, seed_tasks
from verifier.families import Judgement, Validation, judge_answers, validate_proposals
from verifier.metrics import Coverage, program_metrics, structure_fingerprint, structure_hash
from verifier.prompts import Answer, Proposal, parse_answer, parse_proposal, student_prompt, teacher_prompt
from verifier.sandbox import ExecResult, Status, Verifier
from verifier.tasks import FAMILIES, Task, identity_task

__all__ = [
    "FAMILIES",
    "Answer",
    "Coverage",
    "ExecResult",
    "Judgement",
    "Proposal",
    "Status",
    "Task",
    "TaskBuffer",
    "Validation",
    "Verifier",
    "identity_task",
    "judge_answers",
    "make_buffers",
    "parse_answer",
    "parse_proposal",
    "program_metrics",
    "seed_tasks",
    "structure_fingerprint",
    "structure_hash",
    "student_prompt",
    "teacher_prompt",
    "validate_proposals",
]
