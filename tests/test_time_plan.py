"""The time plan: its arithmetic on a small hand-checked case, layouts, clusters, missing constants, overrides."""

from __future__ import annotations

import pytest

from configs import PRESETS_DIR, load_config
from planning.memory_plan import ModelDims
from planning.time_constants import ConstantsError, DeviceKind, HostConstants, Sourced, with_overrides
from planning.time_plan import Cluster, ClusterError, Layout, Lengths, candidate_layouts, plan_time, replica_sequences

# A model small enough to count by hand: per layer q, k, v, o 64 x 64, gate/up/down 64 x 128, two norms of 64;
# tied embeddings 100 x 64 and the final norm: N = 2 x (4 x 4,096 + 3 x 8,192 + 128) + 6,400 + 64 = 88,640.
DIMS = ModelDims(hidden=64, intermediate=128, layers=2, heads=1, kv_heads=1, vocab=100, tied_embeddings=True, qkv_bias=False)
N = 88_640
# rank 2 on all seven projections: 2 layers x 2 x (4 x 128 + 3 x 192) = 4,352 parameters per adapter
N_LORA = 4_352
KIND = DeviceKind("T", 80.0, peak_flops=Sourced(1e9, "test"), memory_bandwidth=Sourced(1e6, "test"),
                  train_mfu=Sourced(0.25, "test"), prefill_mfu=Sourced(0.5, "test"), decode_mfu=Sourced(0.1, "test"),
                  lora_decode_overhead=Sourced(0.5, "test"), sleep_wake_s=Sourced(2.0, "test"))
HOST = HostConstants(verifier_tasks_per_core_s=Sourced(100.0, "test"), adapter_load_bandwidth=Sourced(1e6, "test"),
                     adapter_swap_s=Sourced(0.01, "test"), checkpoint_bandwidth=Sourced(1e6, "test"),
                     league_s=Sourced(0.05, "test"), evolution_s_per_mparam=Sourced(1.0, "test"),
                     evolution_s_floor=Sourced(0.1, "test"))
LENGTHS = Lengths(propose_prompt=10, proposal=20, solve_prompt=30, answer=40, valid_fraction=0.5)


def small_config(*overrides: str):
    return load_config(PRESETS_DIR / "tiny.yaml", [
        "lora.rank=2", "population.teachers=2", "population.students=2", "tasks.tasks_per_teacher=4",
        "tasks.rollouts_k=2", "tasks.families=[code_o]", "inference.max_tokens=50", "inference.backend=hf",
        "verifier.actors=2", "verifier.cpus_per_actor=0.5", "evolution.period=5", "run.checkpoint_every=5", *overrides])


def test_dims_are_the_hand_counted_ones():
    from planning.memory_plan import lora_params

    assert DIMS.base_params() == N
    assert lora_params(DIMS, 2, list(DIMS.module_widths())) == N_LORA


def test_every_phase_of_a_small_case_by_hand():
    """8 proposals (2 teachers x 4), half valid, 2 rollouts each: 8 rollouts; one GPU of engines, one of learners."""
    plan = plan_time(small_config(), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
    phases = {p.name: p.seconds for p in plan.phases}
    tail = 50 * (N * 4 / 1e6)  # the longest row's 50 decode steps, each reading the float32 weights once
    assert phases["propose"] == pytest.approx(2 * N * 80 / (1e9 * 0.5) + 2 * N * 160 / (1e9 * 0.1 * 0.5) + tail)
    # the transformers engine prefills each rollout's prompt (no prefix cache): 8 x 30 prompt, 8 x 40 new tokens
    assert phases["solve"] == pytest.approx(2 * N * 240 / (1e9 * 0.5) + 2 * N * 320 / (1e9 * 0.1 * 0.5) + tail)
    assert phases["validate"] == pytest.approx(16 / 100)  # each proposal run twice, on 2 x 0.5 cores
    assert phases["judge"] == pytest.approx(8 / 100)
    # one learner GPU trains every token: teachers 2 x 4 x 30, students 8 x 70; F = 4 N + 6 N_lora
    assert phases["train"] == pytest.approx((240 + 560) * (4 * N + 6 * N_LORA) / (1e9 * 0.25))
    assert phases["handover"] == pytest.approx(4 * (N_LORA * 4 / 1e6 + 0.01))  # one replica; replicas load in parallel
    assert phases["league"] == pytest.approx(0.05)
    assert phases["evolve"] == pytest.approx(2 * (0.1 + N_LORA / 1e6) / 5)
    assert phases["checkpoint"] == pytest.approx(4 * 12 * N_LORA / 1e6 / 5)
    assert plan.step_seconds == pytest.approx(sum(phases.values()))
    assert plan.busy()["inference"] == pytest.approx((phases["propose"] + phases["solve"]) / plan.step_seconds)
    assert plan.busy()["learners"] == pytest.approx(phases["train"] / plan.step_seconds)
    assert plan.gpu_busy() == pytest.approx((phases["propose"] + phases["solve"] + phases["train"]) / 2 / plan.step_seconds)
    assert plan.critical().name == "solve"
    assert plan.steps_per_hour == pytest.approx(3600 / plan.step_seconds)



def test_two_replicas_share_the_generation_and_add_the_work_queues_tail():
    """The small case's engines on 2 GPUs (2 replicas): each phase's prefill and decode work W (seconds on one
    replica) over 2 and the longest row's tail once. Its 8 proposals and 8 rollouts fit one replica's batch (256
    rows): one piece per replica, no queue tail. With vLLM's max_num_seqs = 2 the 8 rows make 4 pieces (2 per
    replica), which add (1 - 1/2) x W / (2 x 2 x 2) (planning.dispatch)."""
    tail = 50 * (N * 4 / 1e6)
    for extra, pieces_per_replica in (([], 1), (["inference.vllm_engine_args.max_num_seqs=2"], 2)):
        plan = plan_time(small_config(*extra), DIMS, Layout(2, 1), Cluster(1, 3, "T"), LENGTHS, {"T": KIND}, HOST,
                         checkpointing=False)
        phases = {p.name: p.seconds for p in plan.phases}
        for name, prompt, new in (("propose", 80, 160), ("solve", 240, 320)):
            work = 2 * N * prompt / (1e9 * 0.5) + 2 * N * new / (1e9 * 0.1 * 0.5)
            queue = 0.5 * work / (2 * 2 * pieces_per_replica) if pieces_per_replica > 1 else 0.0
            assert phases[name] == pytest.approx(work / 2 + tail + queue), (name, extra)

def test_checkpointing_kl_and_epochs_add_their_passes():
    base = plan_time(small_config(), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
    more = plan_time(small_config("rl.kl_coef=0.1", "rl.epochs=2"), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS,
                     {"T": KIND}, HOST, checkpointing=True)
    train = {p.name: p.seconds for p in base.phases}["train"]
    # (6 N + 6 N_lora) x 2 epochs + 2 N (reference) + 2 N (old policy) against 4 N + 6 N_lora
    expected = train * ((6 * N + 6 * N_LORA) * 2 + 4 * N) / (4 * N + 6 * N_LORA)
    assert {p.name: p.seconds for p in more.phases}["train"] == pytest.approx(expected)


def test_learner_gpus_take_members_by_index_and_wait_for_the_busiest():
    """4 teachers and 4 students over 3 learner GPUs: member i on GPU i mod 3, so GPUs 0 and 1 carry two of each."""
    config = small_config("population.teachers=4", "population.students=4")
    plan = plan_time(config, DIMS, Layout(1, 3), Cluster(1, 4, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
    per_teacher, per_student = 4 * 30, 16 * 0.5 * 2 / 4 * 70
    busiest = 2 * per_teacher + 2 * per_student
    assert {p.name: p.seconds for p in plan.phases}["train"] == pytest.approx(busiest * (4 * N + 6 * N_LORA) / 0.25e9)


def test_data_parallel_gives_every_learner_gpu_an_equal_share_and_pays_the_exchange():
    """rl.data_parallel over 3 learner GPUs: each trains a third of all tokens; each epoch every GPU reads, per role,
    (4 members + 2 cuts) float32 gradients at the hand-over's bandwidth."""
    for epochs in (1, 2):
        config = small_config("population.teachers=4", "population.students=4", "rl.data_parallel=true",
                              "resources.learner_gpus=3", f"rl.epochs={epochs}")
        plan = plan_time(config, DIMS, Layout(1, 3), Cluster(1, 4, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
        total = 4 * 4 * 30 + 16 * 0.5 * 2 * 70
        flops = (4 * N + 6 * N_LORA) * epochs + 2 * N * (epochs > 1)
        exchange = epochs * 2 * (4 + 2) * 4 * N_LORA / 1e6
        assert {p.name: p.seconds for p in plan.phases}["train"] == pytest.approx(total / 3 * flops / 0.25e9 + exchange)
    one = plan_time(config, DIMS, Layout(3, 1), Cluster(1, 4, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
    assert "gradient exchange" not in next(p for p in one.phases if p.name == "train").detail  # one GPU: nothing to split


def test_on_cpu_each_learner_is_its_own_process():
    plan = plan_time(small_config(), DIMS, Layout(0, 0), Cluster(1, 0, "T"), LENGTHS, {"cpu": KIND}, HOST, checkpointing=False)
    assert {p.name: p.seconds for p in plan.phases}["train"] == pytest.approx(560 * (4 * N + 6 * N_LORA) / 0.25e9)


def test_vllm_prefills_a_students_prompt_once_for_its_rollouts():
    hf = plan_time(small_config(), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    vllm = plan_time(small_config("inference.backend=vllm"), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    saved = {p.name: p.seconds for p in hf.phases}["solve"] - {p.name: p.seconds for p in vllm.phases}["solve"]
    assert saved == pytest.approx(2 * N * (240 - 120) / (1e9 * 0.5))


def test_requests_split_over_the_replicas_as_system_generate_splits_them():
    assert replica_sequences(256, 5, 1) == [52, 52, 52, 52, 48]  # ceil(256 / 5) proposals each, the last fewer
    assert replica_sequences(179, 5, 8) == [288, 288, 288, 288, 280]  # 36 prompts x 8 rollouts, the last 35
    assert replica_sequences(3, 5, 8) == [8, 8, 8, 0, 0]


def test_decode_runs_in_waves_when_a_replica_has_more_sequences_than_it_decodes_at_once():
    """8 proposals and 8 rollouts on one vLLM replica, at most 3 at once (max_num_seqs; the KV cache of an 80 GiB GPU
    holds far more): 3 waves a phase. Each wave but the last decodes the expected new tokens (20 a proposal, 40 an
    answer), the last the longest row's 50: 2 x 20 and 2 x 40 more decode steps, each reading the float32 weights."""
    step = N * 4 / 1e6
    vllm = small_config("inference.backend=vllm")
    at_once = plan_time(vllm, DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    limited = plan_time(small_config("inference.backend=vllm", "inference.vllm_engine_args.max_num_seqs=3"), DIMS,
                        Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    one, three = ({p.name: p.seconds for p in plan.phases} for plan in (at_once, limited))
    assert three["propose"] - one["propose"] == pytest.approx(2 * 20 * step)
    assert three["solve"] - one["solve"] == pytest.approx(2 * 40 * step)
    assert [(load.sequences, load.running, load.waves) for load in limited.loads["solve"]] == [(8, 3, 3)]
    assert "replica 0: propose 8 sequences, 3 at once (3 waves); solve 8 sequences, 3 at once (3 waves)" in limited.render()
    assert "replica 0: propose 8 sequences, all at once; solve 8 sequences, all at once" in at_once.render()
    assert "3 waves on the busiest replica" in next(p.detail for p in limited.phases if p.name == "solve")
    hf = plan_time(small_config(), DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    assert hf.kv is None and "decode concurrency" not in hf.render()  # no paged cache: its batch decodes at once


@pytest.mark.parametrize("backend, switch", [("vllm", 2.0), ("hf", 0.0)])
def test_colocated_layout_gives_every_gpu_to_each_phase_and_pays_the_switch(backend, switch):
    """vLLM sleeps and wakes (sleep_wake_s); the transformers engine has no sleep mode and stays awake: no switch."""
    config = small_config(f"inference.backend={backend}")
    plan = plan_time(config, DIMS, Layout(2, 2, colocated=True), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    phases = {p.name: p.seconds for p in plan.phases}
    assert phases["switch"] == switch and set(plan.busy()) == {"gpus"} and plan.engine == backend
    assert plan.gpu_busy() == pytest.approx((phases["propose"] + phases["solve"] + phases["train"]) / plan.step_seconds)
    unmeasured = plan_time(config, DIMS, Layout(2, 2, colocated=True), Cluster(1, 2, "T"), LENGTHS,
                           {"T": DeviceKind(**{**KIND.__dict__, "sleep_wake_s": None})}, HOST)
    assert any("sleep_wake_s" in m for m in unmeasured.missing) == (backend == "vllm")


def test_candidate_layouts_and_cluster_descriptions():
    assert [l.name for l in candidate_layouts(Cluster.parse("8xH100"), 2)] == ["2+6 (tp 2)", "4+4 (tp 2)", "6+2 (tp 2)",
                                                                                 "colocated 8 GPUs (tp 2)"]
    two = Cluster.parse("2x8xH100")
    assert (two.nodes, two.gpus_per_node, two.kind, two.gpus, str(two)) == (2, 8, "H100", 16, "2x8xH100")
    for bad in ("8", "H100", "0x8xH100", "2x0xH100", "two x 8"):
        with pytest.raises(ClusterError, match="--cluster"):
            Cluster.parse(bad)


def test_missing_constants_are_named_and_the_rest_is_planned():
    """A kind nobody measured (no constants): the plan says which are missing and still plans verifiers and host."""
    plan = plan_time(small_config(), DIMS, Layout(1, 1), Cluster(1, 2, "B300"), LENGTHS, {}, HOST)
    assert any(m.startswith("B300: peak_flops") and "generation not planned" in m for m in plan.missing)
    assert any("training not planned" in m for m in plan.missing)
    assert {p.name: p.seconds for p in plan.phases}["validate"] > 0
    assert "constants missing" in plan.render()


def test_overrides_name_known_constants_only():
    kinds, host = with_overrides({"T": KIND}, HOST, {"T.train_mfu": 0.5, "host.league_s": 0.2, "B300.peak_flops": 2e15})
    assert kinds["T"].train_mfu.value == 0.5 and kinds["T"].train_mfu.measured and host.league_s.value == 0.2
    assert kinds["B300"].peak_flops.value == 2e15 and kinds["B300"].train_mfu is None
    with pytest.raises(ConstantsError, match="no device constant 'train_speed'"):
        with_overrides({"T": KIND}, HOST, {"T.train_speed": 1})
    with pytest.raises(ConstantsError, match="no host constant 'disk'"):
        with_overrides({"T": KIND}, HOST, {"host.disk": 1})


def test_every_shipped_constant_names_its_source():
    from dataclasses import fields

    from planning.time_constants import DEVICE_KINDS, HOST as SHIPPED

    for kind in DEVICE_KINDS.values():
        for f in fields(kind):
            value = getattr(kind, f.name)
            if isinstance(value, Sourced):
                assert value.source and value.value >= 0, (kind.name, f.name)
    assert all(getattr(SHIPPED, f.name).source for f in fields(SHIPPED))


# ------------------------------------------------------------------------------------------------ the dry run

@pytest.fixture
def launch(capsys, monkeypatch):
    """``launch.py --dry-run ARGS`` in this process (the dry run starts nothing; a subprocess per call cost ~5 s of
    imports): its exit status and output."""
    from pathlib import Path
    from types import SimpleNamespace

    monkeypatch.setenv("RAY_ADDRESS", "local")  # this machine, never a cluster running on it
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    import launch as launcher

    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = launcher.main(["--dry-run", *args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


@pytest.fixture
def qwen7b(tmp_path):
    import json
    from bench import qwen25_7b

    (tmp_path / "config.json").write_text(json.dumps(qwen25_7b.CONFIG))
    return ["--config", "configs/qwen2.5-7b-4t4s.yaml", f"model.path={tmp_path}"]


def test_dry_run_plans_the_described_node_and_recommends_a_layout(launch, qwen7b):
    """On a machine without GPUs the 7B preset is planned for its 8-GPU node: the configured 4+4 with its phases, every
    layout of the node, and the one closing line; --cluster plans a cluster that is not here."""
    import re

    out = launch(*qwen7b)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert re.fullmatch(r"time: step ~\d+ s overlapped \(\d+ s serial\), GPU busy \d+% \(inference \d+%, learners \d+%\), "
                        r"limited by \w+; recommended: 5\+3 overlapped, data parallel \(this configuration\)",
                        lines[-1]), lines[-1]  # the preset follows the plan
    busy = int(re.search(r"GPU busy (\d+)%", lines[-1]).group(1))
    assert busy >= 80, lines[-1]  # the goal of the ranking (docs/time.md)
    old = launch(*qwen7b, "resources.inference_gpus=6", "resources.learner_gpus=2", "run.max_staleness=0",
                 "rl.data_parallel=false")  # the earlier preset's split, serial
    last = old.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"time: step ~(\d+) s, GPU busy \d+% \(inference \d+%, learners \d+%\), limited by \w+; "
                         r"recommended: 5\+3 overlapped, data parallel \(~(\d+) s, \d+% busy, (\d\.\d\d)x the steps per hour\): "
                         r"resources.inference_gpus=5 resources.learner_gpus=3 resources.colocated=false "
                         r"run.max_staleness=1 rl.data_parallel=true", last)
    assert found, last
    assert float(found.group(3)) >= 1.8 and int(found.group(1)) / int(found.group(2)) >= 1.8  # 6+2 serial -> the pick
    table = out.stdout.split("# ways to run 8xH100")[1]
    shown = [line for line in table.splitlines()[1:] if line[:1] in " *" and " step " in line]
    assert len(shown) == 5 and shown[0].startswith("*5+3 overlapped, data parallel ")  # the best 5, this one first
    assert "python launch.py --dry-run --all lists them" in table
    every = launch(*qwen7b, "--all").stdout.split("# ways to run 8xH100")[1]
    for i in range(1, 8):
        for mode in ("serial", "overlapped"):
            assert f" {i}+{8 - i} {mode} " in every, (i, mode)
    assert re.search(r"^ 1\+7 serial, data parallel .* runs$", every, re.M)
    assert re.search(r"^ 7\+1 serial, data parallel .* not runnable: data parallel needs 2 or more learner GPUs$",
                     every, re.M)
    colocated = every.split("colocated 8 GPUs serial ")[1].splitlines()[0]  # the preset's engine budget leaves no room
    assert "memory: does not fit" in colocated and "gpu_memory_utilization to at most" in colocated
    overlapped_colocated = every.split("colocated 8 GPUs overlapped ")[1].splitlines()[0]
    assert "not runnable: overlap needs engines and learners on separate GPUs" in overlapped_colocated
    for phase in ("propose", "validate", "solve", "judge", "train", "handover", "league", "evolve", "checkpoint"):
        assert re.search(rf"^{phase}\s+\w+\s+\d+\.\d\d", out.stdout, re.M), phase
    # what each replica decodes at once: the preset's max_num_seqs is the plan's, so every phase at once
    assert ("replica 0-3: propose 52 sequences, all at once; solve 288 sequences, all at once\n"
            "replica 4: propose 48 sequences, all at once; solve 280 sequences, all at once\n") in out.stdout
    two = launch(*qwen7b, "--cluster", "2x8xH100", "--all")
    assert two.returncode == 0 and "# ways to run 2x8xH100" in two.stdout and " 8+8 serial " in two.stdout
    assert re.search(r"^[ *]8\+8 serial .* runs$", two.stdout, re.M), "a layout wider than one node runs across the nodes"


def test_dry_run_says_what_each_replica_decodes_at_once_and_warns_of_a_max_num_seqs_too_large(launch, qwen7b):
    fewer = launch(*qwen7b, "inference.vllm_engine_args.max_num_seqs=96")  # the earlier presets' value
    assert fewer.returncode == 0, fewer.stderr
    assert "replica 0-3: propose 52 sequences, all at once; solve 288 sequences, 96 at once (3 waves)" in fewer.stdout
    assert "warning:" not in fewer.stdout
    more = launch(*qwen7b, "inference.vllm_engine_args.max_num_seqs=400")
    assert more.returncode == 0, more.stderr  # a warning, not a refusal
    assert ("\nwarning: inference.vllm_engine_args.max_num_seqs=400 is more than the 291 the plan would choose: "
            "400 sequences of 1,536 expected tokens (propose) take 614,400 of each replica's ") in more.stdout
    assert "preempts" in more.stdout and "set inference.vllm_engine_args.max_num_seqs=291" in more.stdout


def test_dry_run_refuses_a_layout_larger_than_the_described_node_and_bad_clusters(launch, qwen7b):
    small = launch(*qwen7b, "--cluster", "4xH100")
    assert small.returncode == 1
    assert small.stdout.strip().splitlines()[-1].startswith("time: does not fit: layout 5+3 needs 8 GPUs; the described "
                                                          "cluster 4xH100 has 4")
    bad = launch(*qwen7b, "--cluster", "eight")
    assert bad.returncode == 2 and "--cluster 'eight'" in bad.stdout
    unknown = launch(*qwen7b, "--cluster", "8xB200")
    assert unknown.returncode == 0
    assert unknown.stdout.strip().splitlines()[-1].startswith("time: not fully planned: B200: peak_flops")


def test_from_run_replans_with_the_lengths_a_run_recorded(launch, qwen7b, tmp_path):
    """A run directory written here in the project's own format: two steps with token counts, a checkpoint event."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "valid_rate": 0.5, "phase_seconds": {"propose": 10.0, "solve": 20.0, "train": 30.0 + s},
             "tokens": {"teacher": {"sequences": 10, "prompt": 3000, "completion": 2000},
                        "student": {"sequences": 40, "prompt": 8000, "completion": 16000}}} for s in (1, 2, 3)]
    lines = [json.dumps(r) for r in rows] + [json.dumps({"event": "checkpoint", "checkpoint_step": 3, "seconds": 4.0})]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = launch(*qwen7b, "--from-run", str(run))
    assert out.returncode == 0, out.stderr
    assert f"lengths from {run} (2 steps)" in out.stdout  # the first step (start-up) is left out
    assert "1,434 rollouts" not in out.stdout and "200 prompt + 400 new" in out.stdout  # student lengths of the run
    assert "# measured in the run (mean of 2 steps): propose 10.00 s, solve 20.00 s, train 32.50 s, checkpoint 2.00 s" in out.stdout
    missing = launch(*qwen7b, "--from-run", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no metrics.jsonl there" in missing.stderr
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "valid_rate": 0.5}) + "\n")
    old = launch(*qwen7b, "--from-run", str(run))
    assert old.returncode == 2 and "token counts" in old.stderr


def test_only_an_engine_replica_must_fit_one_node():
    """The one rule the dry run and the layout chooser share: a replica's tp GPUs on one node; a layout without an
    engine GPU (the CPU layout, learners only) has nothing to fit."""
    assert Layout(0, 0).engine_wider_than(0) is False
    assert Layout(0, 8).engine_wider_than(0) is False
    assert Layout(4, 4, tp=4).engine_wider_than(2) is True
    assert Layout(8, 0, tp=2).engine_wider_than(2) is False
