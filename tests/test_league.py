"""League: TrueSkill ratings, win probability, PFSP matching, decayed win rates, JSON state."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import trueskill

from evolution.league import League, TaskOutcome


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def population(league: League, teachers=4, students=4) -> League:
    for i in range(teachers):
        league.add_member(f"t{i}", "teacher")
    for i in range(students):
        league.add_member(f"s{i}", "student")
    return league


@pytest.mark.parametrize("beta", [25 / 6, 1.0, 12.0])
def test_win_probability_is_the_formula_with_the_env_beta(beta):
    league = League(beta=beta)
    league.add_member("a", "teacher", mu=30.0, sigma=2.0)
    league.add_member("b", "student", mu=24.0, sigma=5.0)
    expected = phi(6.0 / math.sqrt(2 * beta**2 + 4.0 + 25.0))
    assert league.win_probability("a", "b") == pytest.approx(expected, abs=1e-6)
    assert league.win_probability("a", "b") + league.win_probability("b", "a") == pytest.approx(1.0, abs=1e-6)
    assert trueskill.BETA == pytest.approx(25 / 6)  # the module global was never touched


def test_pfsp_variance_prefers_the_balanced_student():
    league = League(epsilon=0.0)
    league.add_member("t", "teacher", mu=25.0, sigma=1.0)
    for name, mu in {"weak": 5.0, "even": 25.5, "strong": 45.0}.items():
        league.add_member(name, "student", mu=mu, sigma=1.0)
    probs = league.pfsp_probabilities("t", ["weak", "even", "strong"])
    assert max(probs, key=probs.get) == "even"
    weights = {s: league.win_probability("t", s) * (1 - league.win_probability("t", s)) for s in probs}
    total = sum(weights.values())
    assert all(probs[s] == pytest.approx(weights[s] / total) for s in probs)


def test_pfsp_hard_prefers_the_strongest_student():
    league = League(pfsp_weighting="hard", pfsp_exponent=2.0, epsilon=0.0)
    league.add_member("t", "teacher", mu=25.0)
    for name, mu in {"weak": 15.0, "even": 25.0, "strong": 35.0}.items():
        league.add_member(name, "student", mu=mu)
    probs = league.pfsp_probabilities("t", ["weak", "even", "strong"])
    assert probs["strong"] > probs["even"] > probs["weak"]


@pytest.mark.parametrize("weighting", ["variance", "hard"])
def test_pfsp_all_decided_falls_back_to_uniform_without_nan(weighting):
    league = League(beta=0.1, pfsp_weighting=weighting, epsilon=0.1)
    league.add_member("t", "teacher", mu=1000.0, sigma=0.01)
    for i in range(3):
        league.add_member(f"s{i}", "student", mu=-1000.0, sigma=0.01)
    assert league.win_probability("t", "s0") == 1.0
    probs = league.pfsp_probabilities("t", ["s0", "s1", "s2"])
    assert all(p == pytest.approx(1 / 3) for p in probs.values())
    assert set(league.match(["t"], ["s0", "s1", "s2"]).values()) <= {"s0", "s1", "s2"}


def test_epsilon_floor_gives_every_student_a_chance():
    league = League(epsilon=0.2)
    league.add_member("t", "teacher", mu=25.0, sigma=0.5)
    league.add_member("even", "student", mu=25.0, sigma=0.5)
    league.add_member("far", "student", mu=90.0, sigma=0.5)
    probs = league.pfsp_probabilities("t", ["even", "far"])
    assert probs["far"] >= 0.2 / 2 - 1e-12
    assert sum(probs.values()) == pytest.approx(1.0)


def test_match_pairs_every_teacher_and_follows_pfsp_frequencies():
    league = League(seed=4, epsilon=0.0)
    league.add_member("t", "teacher", mu=25.0, sigma=1.0)
    league.add_member("even", "student", mu=25.0, sigma=1.0)
    league.add_member("far", "student", mu=33.0, sigma=1.0)
    expected = league.pfsp_probabilities("t", ["even", "far"])
    counts = Counter(league.match(["t"], ["even", "far"])["t"] for _ in range(2000))
    assert counts["even"] / 2000 == pytest.approx(expected["even"], abs=0.04)
    pairs = population(League(seed=1)).match([f"t{i}" for i in range(4)], [f"s{i}" for i in range(4)])
    assert sorted(pairs) == ["t0", "t1", "t2", "t3"] and set(pairs.values()) <= {"s0", "s1", "s2", "s3"}


def test_match_is_seeded():
    first = [population(League(seed=9)).match(["t0", "t1", "t2"], ["s0", "s1", "s2"]) for _ in range(2)]
    assert first[0] == first[1]


def test_independent_draws_leave_a_student_idle_as_the_product_of_misses():
    """4 teachers drawing uniformly (epsilon 1) leave a given student out with probability (3/4)^4 = 0.316: the
    expected idle share of the default matching, measured over 4,000 steps (sd of the mean ~0.004)."""
    from evolution.league import idle_student_share

    league = population(League(seed=2, epsilon=1.0))
    teachers, students = league.members("teacher"), league.members("student")
    shares = [idle_student_share(league.match(teachers, students).items(), students) for _ in range(4000)]
    assert sum(shares) / len(shares) == pytest.approx(0.75**4, abs=0.015)


def test_idle_student_share_counts_the_students_no_pair_drew():
    from evolution.league import idle_student_share

    assert idle_student_share([("t0", "s1"), ("t1", "s1"), ("t2", "s3")], ["s0", "s1", "s2", "s3"]) == 0.5
    assert idle_student_share([("a0", "a0")], ["a0"]) == 0.0 and idle_student_share([], []) == 0.0


@pytest.mark.parametrize("teachers, students", [(4, 4), (6, 4), (4, 3)])
def test_cover_students_lets_every_student_play_when_teachers_are_at_least_students(teachers, students):
    from evolution.league import idle_student_share

    league = population(League(seed=3, matching="cover_students"), teachers, students)
    for s in league.members("student"):  # uneven ratings: PFSP alone would favour the balanced students
        league.shift_mu([s], 3.0 * int(s[1:]))
    t_ids, s_ids = league.members("teacher"), league.members("student")
    for _ in range(300):
        pairs = league.match(t_ids, s_ids)
        assert list(pairs) == t_ids and set(pairs.values()) == set(s_ids)
        assert idle_student_share(pairs.items(), s_ids) == 0.0


def test_cover_students_with_fewer_teachers_draws_distinct_students():
    league = population(League(seed=6, matching="cover_students"), 2, 4)
    for _ in range(300):
        pairs = league.match(["t0", "t1"], ["s0", "s1", "s2", "s3"])
        assert pairs["t0"] != pairs["t1"]


def test_cover_students_draws_pfsp_weighted_without_replacement_in_a_shuffled_order():
    """Two teachers, two students, PFSP probabilities p_t(s) (epsilon 0): the first teacher of the shuffled order
    draws by its PFSP, the second gets the other student, so P(t0 plays s0) = 1/2 p_t0(s0) + 1/2 p_t1(s1)."""
    league = League(seed=7, epsilon=0.0, matching="cover_students")
    league.add_member("t0", "teacher", mu=25.0, sigma=1.0)
    league.add_member("t1", "teacher", mu=19.0, sigma=1.0)
    league.add_member("s0", "student", mu=25.0, sigma=1.0)
    league.add_member("s1", "student", mu=33.0, sigma=1.0)
    p0, p1 = league.pfsp_probabilities("t0", ["s0", "s1"]), league.pfsp_probabilities("t1", ["s0", "s1"])
    assert abs(p0["s0"] - p1["s1"]) > 0.3  # the two teachers disagree: the order matters
    n = 20_000
    hits = sum(league.match(["t0", "t1"], ["s0", "s1"])["t0"] == "s0" for _ in range(n))
    assert hits / n == pytest.approx(0.5 * p0["s0"] + 0.5 * p1["s1"], abs=0.012)  # sd ~0.0035


def test_cover_students_is_seeded_and_resumes_exactly():
    league = population(League(seed=8, matching="cover_students"), 4, 4)
    teachers, students = league.members("teacher"), league.members("student")
    league.match(teachers, students)
    restored = League.from_state_dict(json.loads(json.dumps(league.state_dict())))
    assert restored.config["matching"] == "cover_students"
    assert [restored.match(teachers, students) for _ in range(20)] == [league.match(teachers, students) for _ in range(20)]
    old = league.state_dict()
    del old["config"]["matching"]  # a checkpoint written before the key existed keeps the independent draws
    assert League.from_state_dict(old).config["matching"] == "independent"
    with pytest.raises(ValueError, match="matching"):
        League(matching="round_robin")


def test_ratings_move_the_right_way():
    league = population(League(), 1, 1)
    league.record("t0", "s0", [(True, 0.0)] * 3)  # valid and unsolved: teacher wins
    assert league.rating("t0").mu > 25 > league.rating("s0").mu
    league2 = population(League(), 1, 1)
    league2.record("t0", "s0", [TaskOutcome(False, 0.0)] * 3)  # invalid: teacher loses
    assert league2.rating("t0").mu < 25 < league2.rating("s0").mu
    league3 = population(League(), 1, 1)
    result = league3.record("t0", "s0", [(True, 0.5), (True, 1.0)])  # solved (rho >= 0.5): student wins
    assert result == {"games": 2, "teacher_wins": 0, "student_wins": 2}
    assert league3.rating("s0").mu > 25 and league3.rating("s0").sigma < 25 / 3
    assert league3.rating("s0").conservative == pytest.approx(league3.rating("s0").mu - 3 * league3.rating("s0").sigma)


def test_tau_keeps_sigma_from_collapsing():
    sigmas = {}
    for tau in (25 / 300, 1.0):
        league = population(League(tau=tau), 1, 1)
        for i in range(300):
            league.record("t0", "s0", [(True, float(i % 2))])
        sigmas[tau] = league.rating("t0").sigma
    assert sigmas[1.0] > 2 * sigmas[25 / 300]


def test_decayed_win_rate_matrix():
    league = population(League(winrate_decay=0.9), 2, 2)
    assert league.win_rate("t0", "s0") == 0.5  # prior before any game
    league.record("t0", "s0", [(True, 0.0)] * 4)
    league.record("t0", "s0", [(True, 1.0)] * 4)
    assert league.win_rate("t0", "s0") == pytest.approx(0.9 * 4 / (0.9 * 4 + 4))
    matrix = league.win_rate_matrix()
    assert matrix["t0"]["s0"] == league.win_rate("t0", "s0") and matrix["t1"]["s1"] == 0.5


def test_empirical_blend_moves_the_estimate_toward_observed_results():
    league = population(League(empirical_prior_games=2.0), 1, 1)
    league.record("t0", "s0", [(True, 0.0)] * 8)  # teacher won everything
    x_ts = league.win_probability("t0", "s0")
    assert x_ts < league.estimate("t0", "s0") < 1.0


def test_single_agent_plays_itself_without_moving_its_rating():
    league = League()
    league.add_member("solo", "both")
    assert league.match(["solo"], ["solo"]) == {"solo": "solo"}
    league.record("solo", "solo", [(True, 0.0), (True, 1.0), (False, 0.0)])
    assert league.rating("solo").mu == 25.0
    assert league.win_rate("solo", "solo") == pytest.approx(1 / 3)
    assert league.members("teacher") == league.members("student") == ["solo"]


def test_members_never_play_themselves_when_others_exist():
    league = League(seed=2)
    league.add_member("x", "both")
    league.add_member("y", "both")
    for _ in range(20):
        assert league.match(["x", "y"], ["x", "y"]) == {"x": "y", "y": "x"}


def test_bad_input_is_a_clear_error():
    league = population(League(), 1, 1)
    with pytest.raises(ValueError, match="rho"):
        league.record("t0", "s0", [(True, 1.5)])
    with pytest.raises(ValueError, match="rho"):
        league.record("t0", "s0", [(True, float("nan"))])
    with pytest.raises(ValueError, match="bool"):
        league.record("t0", "s0", [("yes", 0.5)])
    with pytest.raises(ValueError, match="outcome"):
        league.record("t0", "s0", [0.5])
    with pytest.raises(KeyError, match="no member 'ghost'"):
        league.win_probability("t0", "ghost")
    with pytest.raises(ValueError, match="not a teacher"):
        league.match(["s0"], ["s0"])
    with pytest.raises(ValueError, match="already"):
        league.add_member("t0", "teacher")
    with pytest.raises(ValueError, match="role"):
        league.add_member("z", "coach")
    with pytest.raises(ValueError, match="epsilon"):
        League(epsilon=1.5)
    assert league.rating("t0").mu == 25.0  # nothing was half-applied


def test_child_inherits_the_parent_mu_and_removal_drops_its_win_rates():
    league = population(League(), 2, 1)
    league.record("t0", "s0", [(True, 0.0)] * 5)
    league.add_member("t0-child", "teacher", parent="t0", sigma=4.0)
    assert league.rating("t0-child").mu == league.rating("t0").mu and league.rating("t0-child").sigma == 4.0
    league.remove_member("t0")
    assert "t0" not in league and league.games("t0", "s0") == 0.0


def test_unsolved_counts_as_a_teacher_loss_when_configured():
    paper = population(League(), 1, 1)
    assert paper.record("t0", "s0", [(True, 0.0), (True, 0.25), (True, 0.5), (False, 0.0)])["teacher_wins"] == 2
    strict = population(League(unsolved_is_teacher_win=False), 1, 1)
    assert strict.record("t0", "s0", [(True, 0.0), (True, 0.25), (True, 0.5), (False, 0.0)])["teacher_wins"] == 1
    strict.record("t0", "s0", [(True, 0.0)] * 3)  # a valid task nobody solves now moves the rating down
    assert strict.rating("t0").mu < 25 < strict.rating("s0").mu
    restored = League.from_state_dict(json.loads(json.dumps(strict.state_dict())))
    assert restored.config["unsolved_is_teacher_win"] is False
    old = paper.state_dict()
    del old["config"]["unsolved_is_teacher_win"]  # a checkpoint written before the key existed keeps the paper's rule
    assert League.from_state_dict(old).config["unsolved_is_teacher_win"] is True


def test_state_round_trips_through_json_exactly():
    league = population(League(seed=5, tau=0.7, empirical_prior_games=3.0), 3, 3)
    for t, s in league.match(league.members("teacher"), league.members("student")).items():
        league.record(t, s, [(True, 0.25), (False, 0.0), (True, 0.75)])
    restored = League.from_state_dict(json.loads(json.dumps(league.state_dict())))
    assert restored.state_dict() == league.state_dict()
    teachers, students = league.members("teacher"), league.members("student")
    assert [restored.match(teachers, students) for _ in range(5)] == [league.match(teachers, students) for _ in range(5)]
    assert restored.env.tau == 0.7 and restored.ratings() == league.ratings()


def test_league_accepts_the_config_section():
    from configs.schema import Config

    league = League(**Config().league.model_dump(), seed=Config().run.seed)
    assert league.env.tau == Config().league.tau


def test_rating_updates_use_the_league_environment_not_the_global_one():
    league = population(League(beta=1.0, tau=0.0), 1, 1)
    league.record("t0", "s0", [(True, 0.0)])
    env = trueskill.TrueSkill(mu=25.0, sigma=25 / 3, beta=1.0, tau=0.0, draw_probability=0.0)
    winner, _ = trueskill.rate_1vs1(env.create_rating(), env.create_rating(), env=env)
    default_winner, _ = trueskill.rate_1vs1(trueskill.Rating(), trueskill.Rating())
    assert league.rating("t0").mu == pytest.approx(winner.mu)
    assert abs(league.rating("t0").mu - default_winner.mu) > 0.1


def test_report_plots_ratings_relative_to_the_sub_population_mean(tmp_path):
    from reporting.report import plot_ratings, relative_ratings, sub_population_means

    rows = [
        {"step": 1, "members": [{"id": "t0", "role": "teacher", "mu": 30.0, "sigma": 2.0},
                                {"id": "t1", "role": "teacher", "mu": 20.0, "sigma": 2.0},
                                {"id": "s0", "role": "student", "mu": 26.0, "sigma": 3.0}]},
        {"step": 2, "members": [{"id": "t0", "role": "teacher", "mu": 34.0, "sigma": 2.0},
                                {"id": "t2", "role": "teacher", "mu": 22.0, "sigma": 4.0},
                                {"id": "s0", "role": "student", "mu": 21.0, "sigma": 3.0}]},
    ]
    assert sub_population_means(rows) == {"student": [(1, 26.0), (2, 21.0)], "teacher": [(1, 25.0), (2, 28.0)]}
    relative = relative_ratings(rows)
    assert relative["t0"] == [(1, 5.0, "teacher"), (2, 6.0, "teacher")]
    assert relative["t2"] == [(2, -6.0, "teacher")] and relative["s0"] == [(1, 0.0, "student"), (2, 0.0, "student")]
    assert plot_ratings(rows, tmp_path).is_file()
