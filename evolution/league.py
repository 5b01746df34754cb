"""The league: one TrueSkill rating per member, PFSP matching of teachers to students, decayed win rates.

Ratings live on one scale for teachers and students. Each task a teacher proposes to its matched student
is one 1-vs-1 game:

- the student wins if the task is valid and rho >= ``solve_threshold`` (rho = solve fraction of its rollouts);
- the teacher wins if the task is valid and rho < ``solve_threshold`` (with ``unsolved_is_teacher_win=False``,
  only if also rho > 0: a task no rollout solves earns the teacher the reward's floor, not 1 - rho, and counting
  it a win selects teachers for validity alone when students are weak);
- an invalid task is a teacher loss.

Win probability (no draw margin), with the environment's own beta (never ``trueskill``'s module globals):

    P(a beats b) = Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2))

PFSP (Vinyals et al. 2019): teacher t plays student s with probability
(1 - epsilon) f(x_ts) / sum_s' f(x_ts') + epsilon / n, where x_ts = P(t beats s) and
f_var(x) = x (1 - x) (near-balanced pairs) or f_hard(x) = (1 - x)^p (strongest students). A normaliser
below 1e-12 falls back to uniform. Optionally x blends in the decayed empirical win rate:
x = (g x_emp + k x_ts) / (g + k) with g the decayed game count and k = ``empirical_prior_games``.

Matching (``matching``): ``independent`` draws every teacher's student by PFSP on its own (students may serve several
teachers, and with T teachers and S students a student sits a step out with probability prod_t (1 - p_ts), (3/4)^4 =
0.32 for 4 + 4 uniform draws). ``cover_students`` lets every student play each step when T >= S: the teachers are
taken in an order the league's generator shuffles each step, and the first min(T, S) of them draw their students by
PFSP without replacement (teacher k draws from the students not drawn by the k - 1 before it, the PFSP probabilities
renormalised over those, epsilon floor included); the rest draw as ``independent`` does. The generator is the one
the league's state saves, so a resumed run matches exactly as the uninterrupted one.
:func:`idle_student_share` is the share of a step's students that no teacher drew.

Single-agent mode: a member with role 'both' plays teacher and student; a member matched with itself
keeps its rating (a game against oneself carries no rating information) but its win rates are counted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import trueskill

Role = Literal["teacher", "student", "both"]
ROLES: tuple[str, ...] = ("teacher", "student", "both")
MATCHINGS: tuple[str, ...] = ("independent", "cover_students")
STATE_VERSION = 1


@dataclass(frozen=True)
class TaskOutcome:
    """One proposed task: did it pass the verifier, and what fraction of the student's rollouts solved it."""

    valid: bool
    rho: float


@dataclass(frozen=True)
class Rating:
    mu: float
    sigma: float
    conservative: float


@dataclass
class Member:
    id: str
    role: str
    mu: float
    sigma: float
    parent: str | None = None
    games: int = 0


@dataclass
class PairRecord:
    """Decayed counts of one (teacher, student) pair: x = teacher_wins / games."""

    teacher_wins: float = 0.0
    games: float = 0.0


class League:
    """Ratings, PFSP matching and decayed win rates of a population (see module docstring)."""

    def __init__(
        self,
        mu: float = 25.0,
        sigma: float = 25.0 / 3,
        beta: float = 25.0 / 6,
        tau: float = 0.5,
        draw_probability: float = 0.0,
        solve_threshold: float = 0.5,
        pfsp_weighting: Literal["variance", "hard"] = "variance",
        pfsp_exponent: float = 2.0,
        epsilon: float = 0.1,
        winrate_decay: float = 0.95,
        seed: int = 0,
        conservative_k: float = 3.0,
        empirical_prior_games: float | None = None,
        unsolved_is_teacher_win: bool = True,
        matching: Literal["independent", "cover_students"] = "independent",
    ) -> None:
        checks = [
            (math.isfinite(mu), f"mu must be finite, got {mu!r}"),
            (sigma > 0, f"sigma must be > 0, got {sigma!r}"),
            (beta > 0, f"beta must be > 0, got {beta!r}"),
            (tau >= 0, f"tau must be >= 0, got {tau!r}"),
            (0 <= draw_probability < 1, f"draw_probability must be in [0, 1), got {draw_probability!r}"),
            (0 < solve_threshold <= 1, f"solve_threshold must be in (0, 1], got {solve_threshold!r}"),
            (pfsp_weighting in ("variance", "hard"), f"pfsp_weighting must be 'variance' or 'hard', got {pfsp_weighting!r}"),
            (pfsp_exponent > 0, f"pfsp_exponent must be > 0, got {pfsp_exponent!r}"),
            (0 <= epsilon <= 1, f"epsilon must be in [0, 1], got {epsilon!r}"),
            (0 < winrate_decay <= 1, f"winrate_decay must be in (0, 1], got {winrate_decay!r}"),
            (conservative_k >= 0, f"conservative_k must be >= 0, got {conservative_k!r}"),
            (empirical_prior_games is None or empirical_prior_games > 0,
             f"empirical_prior_games must be None or > 0, got {empirical_prior_games!r}"),
            (matching in MATCHINGS, f"matching must be one of {MATCHINGS}, got {matching!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"League: {message}")
        self.config: dict[str, Any] = {
            "mu": float(mu), "sigma": float(sigma), "beta": float(beta), "tau": float(tau),
            "draw_probability": float(draw_probability), "solve_threshold": float(solve_threshold),
            "pfsp_weighting": pfsp_weighting, "pfsp_exponent": float(pfsp_exponent), "epsilon": float(epsilon),
            "winrate_decay": float(winrate_decay), "seed": int(seed), "conservative_k": float(conservative_k),
            "empirical_prior_games": None if empirical_prior_games is None else float(empirical_prior_games),
            "unsolved_is_teacher_win": bool(unsolved_is_teacher_win), "matching": matching,
        }
        self.env = trueskill.TrueSkill(mu=mu, sigma=sigma, beta=beta, tau=tau, draw_probability=draw_probability)
        self._members: dict[str, Member] = {}
        self._pairs: dict[tuple[str, str], PairRecord] = {}
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------------------------------ members

    def add_member(
        self, member_id: str, role: Role, parent: str | None = None, mu: float | None = None, sigma: float | None = None
    ) -> Member:
        """Add a member; a child given ``parent`` and no ``mu`` inherits the parent's mu. Default sigma: the env's."""
        if not isinstance(member_id, str) or not member_id:
            raise ValueError(f"member id must be a non-empty string, got {member_id!r}")
        if member_id in self._members:
            raise ValueError(f"member {member_id!r} is already in the league")
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if mu is None:
            mu = self._members[parent].mu if parent in self._members else self.env.mu
        sigma = self.env.sigma if sigma is None else sigma
        if not math.isfinite(mu) or not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"member {member_id!r}: mu must be finite and sigma > 0, got mu={mu!r}, sigma={sigma!r}")
        member = Member(member_id, role, float(mu), float(sigma), parent)
        self._members[member_id] = member
        return member

    def remove_member(self, member_id: str) -> Member:
        """Drop a member with its rating and every win-rate entry it takes part in."""
        member = self._member(member_id)
        del self._members[member_id]
        self._pairs = {pair: rec for pair, rec in self._pairs.items() if member_id not in pair}
        return member

    def member(self, member_id: str) -> Member:
        return Member(**asdict(self._member(member_id)))

    def members(self, role: str | None = None) -> list[str]:
        """Member ids in insertion order; ``role`` 'teacher'/'student' includes 'both' members."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
        return [m.id for m in self._members.values() if role is None or m.role in (role, "both")]

    def _member(self, member_id: str) -> Member:
        try:
            return self._members[member_id]
        except KeyError:
            raise KeyError(f"no member {member_id!r} in the league (members: {list(self._members)})") from None

    def __contains__(self, member_id: object) -> bool:
        return member_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    # ------------------------------------------------------------------------------------------ ratings

    def rating(self, member_id: str) -> Rating:
        m = self._member(member_id)
        return Rating(m.mu, m.sigma, m.mu - self.config["conservative_k"] * m.sigma)

    def shift_mu(self, member_ids: Iterable[str], delta: float) -> None:
        """Add ``delta`` to the mu of each member given (sigma unchanged): a translation of a sub-population's
        ratings, which leaves every win probability inside it unchanged."""
        if not math.isfinite(delta):
            raise ValueError(f"mu shift must be finite, got {delta!r}")
        for member_id in member_ids:
            self._member(member_id).mu += float(delta)

    def ratings(self) -> dict[str, Rating]:
        return {member_id: self.rating(member_id) for member_id in self._members}

    def win_probability(self, a: str, b: str) -> float:
        """Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2))."""
        ra, rb = self._member(a), self._member(b)
        c = math.sqrt(2 * self.env.beta**2 + ra.sigma**2 + rb.sigma**2)
        return float(self.env.cdf((ra.mu - rb.mu) / c))

    # ------------------------------------------------------------------------------------------ win rates

    def win_rate(self, teacher: str, student: str) -> float:
        """Decayed empirical share of games the teacher won against the student (0.5 before any game)."""
        self._member(teacher)
        self._member(student)
        record = self._pairs.get((teacher, student))
        return record.teacher_wins / record.games if record and record.games > 0 else 0.5

    def games(self, teacher: str, student: str) -> float:
        """Decayed number of games of the pair."""
        record = self._pairs.get((teacher, student))
        return record.games if record else 0.0

    def win_rate_matrix(self, teachers: Sequence[str] | None = None, students: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
        teachers = self.members("teacher") if teachers is None else teachers
        students = self.members("student") if students is None else students
        return {t: {s: self.win_rate(t, s) for s in students} for t in teachers}

    # ------------------------------------------------------------------------------------------ matching

    def estimate(self, teacher: str, student: str) -> float:
        """x_ts used by PFSP: the TrueSkill win probability, blended with the empirical rate if configured."""
        x = self.win_probability(teacher, student)
        k = self.config["empirical_prior_games"]
        if k is not None:
            g = self.games(teacher, student)
            x = (g * self.win_rate(teacher, student) + k * x) / (g + k)
        return x

    def pfsp_weight(self, x: float) -> float:
        """f_var(x) = x (1 - x) or f_hard(x) = (1 - x)^p."""
        if self.config["pfsp_weighting"] == "variance":
            return x * (1.0 - x)
        return (1.0 - x) ** self.config["pfsp_exponent"]

    def pfsp_probabilities(self, teacher: str, students: Sequence[str]) -> dict[str, float]:
        """P(teacher plays s) over ``students``: PFSP weights mixed with an epsilon-uniform floor."""
        if not students:
            raise ValueError("PFSP needs at least one candidate student")
        weights = [self.pfsp_weight(self.estimate(teacher, s)) for s in students]
        total = sum(weights)
        n = len(students)
        if not (math.isfinite(total) and total > 1e-12):
            shares = [1.0 / n] * n  # every pair decided (or NaN): nothing to prefer
        else:
            shares = [w / total for w in weights]
        eps = self.config["epsilon"]
        return {s: (1 - eps) * p + eps / n for s, p in zip(students, shares)}

    def match(self, teachers: Sequence[str], students: Sequence[str]) -> dict[str, str]:
        """Pair every teacher with one student drawn by PFSP, as ``matching`` says (module docstring): students may
        serve several teachers; with ``cover_students`` and T >= S every student serves at least one.

        A member never plays itself unless it is the only candidate (single-agent mode). Returns {teacher: student}
        in the order of ``teachers``.
        """
        if not teachers or not students:
            raise ValueError(f"match needs at least one teacher and one student, got {list(teachers)} and {list(students)}")
        for t in teachers:
            if self._member(t).role not in ("teacher", "both"):
                raise ValueError(f"{t!r} is a {self._member(t).role}, not a teacher")
        for s in students:
            if self._member(s).role not in ("student", "both"):
                raise ValueError(f"{s!r} is a {self._member(s).role}, not a student")
        if self.config["matching"] == "independent":
            return {t: self._draw(self.pfsp_probabilities(t, [s for s in students if s != t] or [t])) for t in teachers}
        order = list(teachers)
        self._rng.shuffle(order)
        pairs: dict[str, str] = {}
        free = list(students)  # not drawn yet, in the order given
        for k, t in enumerate(order):
            others = [s for s in students if s != t] or [t]
            candidates = [s for s in free if s != t] if k < min(len(teachers), len(students)) else []
            pairs[t] = self._draw(self.pfsp_probabilities(t, candidates or others))
            if pairs[t] in free:
                free.remove(pairs[t])
        return {t: pairs[t] for t in teachers}

    def _draw(self, probs: dict[str, float]) -> str:
        """One key of ``probs`` drawn with probability proportional to its value (one number from the generator)."""
        u = self._rng.random() * sum(probs.values())
        acc = 0.0
        for key, p in probs.items():
            acc += p
            if u < acc:
                return key
        return key  # u == total up to rounding

    # ------------------------------------------------------------------------------------------ results

    def record(self, teacher: str, student: str, outcomes: Iterable[TaskOutcome | tuple[bool, float]]) -> dict[str, int]:
        """Rate every task of one match as a game and update the pair's decayed win rate.

        ``outcomes``: (valid, rho) per task. Returns the counts {'games', 'teacher_wins', 'student_wins'}.
        """
        t, s = self._member(teacher), self._member(student)
        if t.role not in ("teacher", "both"):
            raise ValueError(f"{teacher!r} is a {t.role}, not a teacher")
        if s.role not in ("student", "both"):
            raise ValueError(f"{student!r} is a {s.role}, not a student")
        results = [self._teacher_wins(o) for o in outcomes]
        if not results:
            return {"games": 0, "teacher_wins": 0, "student_wins": 0}
        if teacher != student:
            rt, rs = trueskill.Rating(t.mu, t.sigma), trueskill.Rating(s.mu, s.sigma)
            for teacher_won in results:
                if teacher_won:
                    rt, rs = trueskill.rate_1vs1(rt, rs, env=self.env)
                else:
                    rs, rt = trueskill.rate_1vs1(rs, rt, env=self.env)
            t.mu, t.sigma, s.mu, s.sigma = float(rt.mu), float(rt.sigma), float(rs.mu), float(rs.sigma)
            s.games += len(results)
        t.games += len(results)
        decay = self.config["winrate_decay"]
        pair = self._pairs.setdefault((teacher, student), PairRecord())
        pair.teacher_wins = decay * pair.teacher_wins + sum(results)
        pair.games = decay * pair.games + len(results)
        wins = sum(results)
        return {"games": len(results), "teacher_wins": wins, "student_wins": len(results) - wins}

    def _teacher_wins(self, outcome: Any) -> bool:
        if isinstance(outcome, TaskOutcome):
            valid, rho = outcome.valid, outcome.rho
        else:
            try:
                valid, rho = outcome
            except (TypeError, ValueError):
                raise ValueError(f"an outcome is (valid: bool, rho: float) or a TaskOutcome, got {outcome!r}") from None
        if valid not in (True, False):
            raise ValueError(f"outcome validity must be a bool, got {valid!r}")
        try:
            rho = float(rho)
        except (TypeError, ValueError):
            raise ValueError(f"outcome rho must be a number in [0, 1], got {rho!r}") from None
        if not 0.0 <= rho <= 1.0:  # also rejects NaN
            raise ValueError(f"outcome rho must be in [0, 1], got {rho!r}")
        if not valid or rho >= self.config["solve_threshold"]:
            return False
        return rho > 0.0 or self.config["unsolved_is_teacher_win"]

    # ------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state; ``League.from_state_dict(json.loads(json.dumps(s)))`` restores it exactly."""
        version, internal, gauss = self._rng.getstate()
        return {
            "version": STATE_VERSION,
            "config": dict(self.config),
            "members": [asdict(m) for m in self._members.values()],
            "pairs": [[t, s, rec.teacher_wins, rec.games] for (t, s), rec in self._pairs.items()],
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"league state version {state.get('version')!r} is not {STATE_VERSION}")
        fresh = League(**state["config"])
        self.config, self.env = fresh.config, fresh.env
        self._members = {m["id"]: Member(**m) for m in state["members"]}
        self._pairs = {(t, s): PairRecord(float(w), float(g)) for t, s, w, g in state["pairs"]}
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "League":
        league = cls(**state["config"])
        league.load_state_dict(state)
        return league


def idle_student_share(pairs: Iterable[tuple[str, str]], students: Sequence[str]) -> float:
    """The share of ``students`` that no (teacher, student) pair of a step drew: 1 - |drawn & students| / |students|
    (0.0 for no students)."""
    if not students:
        return 0.0
    drawn = {student for _, student in pairs}
    return 1.0 - len(drawn & set(students)) / len(students)
