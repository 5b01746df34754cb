"""``python -m evaluation`` on a tiny run: every member, the base and a compared (single-agent) run
in one engine, one mixed-adapter pass per benchmark; the table, results.json and the chart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import evaluation_files as files
from configs import Config, dump_config
from evaluation.__main__ import main


def write_run(root: Path, model: Path, members: dict[int, list[str]], step: int, seed: int) -> Path:
    """A run directory with config.yaml and one checkpoint of random (non-zero) PEFT adapters."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = Config.model_validate({"model": {"path": str(model), "max_seq_len": 512}, "lora": {"rank": 4, "alpha": 8.0},
                                    "tasks": {"prompt_style": "r1"}, "inference": {"backend": "hf", "max_tokens": 6}})
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(dump_config(config))
    for learner, names in members.items():
        for k, name in enumerate(names):
            torch.manual_seed(seed + 10 * learner + k)
            base = AutoModelForCausalLM.from_pretrained(model)
            peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=list(config.lora.target_modules), init_lora_weights=False))
            peft.save_pretrained(root / "checkpoints" / f"step-{step}" / "learners" / str(learner) / "adapters" / name)
    (root / "checkpoints" / "latest").write_text(f"step-{step}")
    return root


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_evaluates_every_member_the_base_and_a_compared_run(tiny_qwen2, tmp_path, capsys):
    run = write_run(tmp_path / "population", tiny_qwen2, {0: ["m0", "m1"], 1: ["m2"]}, step=4, seed=0)
    single = write_run(tmp_path / "single", tiny_qwen2, {0: ["agent"]}, step=4, seed=100)
    data = tmp_path / "data"
    files.humaneval_check(data / "HumanEval.jsonl")
    files.write_jsonl(data / "gsm8k" / "test.jsonl", files.MATH_ROWS["gsm8k"] * 2)
    before = {p: digest(p) for p in (data, tiny_qwen2, run / "checkpoints", single)}

    assert main([str(run), "--benchmarks", "humaneval,gsm8k", "--data", str(data), "--compare", str(single),
                 "--workers", "2", "--timeout-floor", "2"]) == 0
    out = capsys.readouterr()
    results = json.loads((run / "eval/step-4/results.json").read_text())
    assert set(results["models"]) == {"m0", "m1", "m2", "base", "compare:agent"}
    assert {m["group"] for m in results["models"].values()} == {"population", "base", "compare"}
    for name in ("humaneval", "gsm8k"):
        timing = results["timings"][name]
        assert timing["engine_passes"] == 1 and timing["rejected"] == 0  # every prompt fits the context
        assert timing["requests"] == results["benchmarks"][name]["problems"] * 5  # every model in the one pass
        for model in results["models"].values():
            score = model["benchmarks"][name]
            assert 0.0 <= score["pass@1"] <= 1.0 and score["n"] == results["benchmarks"][name]["problems"]
            assert all(len(t["passed"]) == 1 and len(t["reasons"]) == 1 for t in score["tasks"])
    assert results["prompt_style"] == "r1" and results["engine"] == "HFEngine" and results["math_grader"] == "math-verify"
    table = (run / "eval/step-4/results.md").read_text()
    for row in ("| m0 |", "| m1 |", "| m2 |", "| population mean |", "| weakest member (", "| base |", "| compare:agent |"):
        assert row in table and row in out.out
    assert table.splitlines()[0] == "| model | humaneval | gsm8k | mean |"
    assert (run / "eval/step-4/results.png").read_bytes()[:4] == b"\x89PNG"
    # nothing written into the model, the data or the checkpoints
    assert {p: digest(p) for p in before} == before


def test_a_compared_run_on_another_base_is_refused(tiny_qwen2, tiny_llama, tmp_path, capsys):
    run = write_run(tmp_path / "a", tiny_qwen2, {0: ["m0"]}, step=1, seed=0)
    other = write_run(tmp_path / "b", tiny_llama, {0: ["m0"]}, step=1, seed=0)
    data = tmp_path / "data"
    files.write_jsonl(data / "gsm8k.jsonl", files.MATH_ROWS["gsm8k"])
    assert main([str(run), "--benchmarks", "gsm8k", "--data", str(data), "--compare", str(other)]) == 2
    assert "one engine serves one base model" in capsys.readouterr().err


def test_samples_give_pass_at_k_from_every_sample(tiny_qwen2, tmp_path, capsys):
    run = write_run(tmp_path / "population", tiny_qwen2, {0: ["m0", "m1"]}, step=2, seed=0)
    data = tmp_path / "data"
    files.write_jsonl(data / "aime24.jsonl", files.MATH_ROWS["aime24"] * 2)
    assert main([str(run), "--benchmarks", "aime24", "--data", str(data), "--samples", "5", "--no-base", "--max-tokens", "4"]) == 0
    results = json.loads((run / "eval/step-2/results.json").read_text())
    assert results["k"] == [1, 5] and set(results["models"]) == {"m0", "m1"}
    for model in results["models"].values():
        score = model["benchmarks"]["aime24"]
        assert score["samples"] == 5 and all(len(t["passed"]) == 5 for t in score["tasks"])
        from evaluation.passk import mean_pass_at_k

        counts = [(5, sum(t["passed"])) for t in score["tasks"]]
        assert score["pass@1"] == mean_pass_at_k(counts, 1) and score["pass@5"] == mean_pass_at_k(counts, 5)
        assert len({r for t in score["tasks"] for r in t["responses"]}) > 1  # sampled, not greedy copies
    assert "| population mean |" in capsys.readouterr().out


def test_training_evaluator_logs_every_member_to_metrics_and_tensorboard(tiny_qwen2, tmp_path):
    from inference import make_engine
    from reporting.run_dir import RunDirectory
    from configs import load_config
    from evaluation.training import TrainingEvaluator

    run = write_run(tmp_path / "population", tiny_qwen2, {0: ["m0", "m1"]}, step=2, seed=0)
    data = tmp_path / "data"
    files.write_jsonl(data / "gsm8k" / "test.jsonl", files.MATH_ROWS["gsm8k"])
    files.humaneval_check(data / "HumanEval.jsonl")
    config = load_config(run / "config.yaml", ["eval.every=2", "eval.benchmarks=[gsm8k,humaneval]", f"eval.data={data}", "eval.max_tokens=4"])
    evaluator = TrainingEvaluator(config, tiny_qwen2)
    engine = make_engine("hf", tiny_qwen2, max_adapters=2, max_lora_rank=4, max_model_len=512, target_modules=list(config.lora.target_modules))
    calls = []

    def generate(requests):
        calls.append(len(requests))
        return engine.generate(requests)

    try:
        for name in ("m0", "m1"):
            engine.load_adapter(name, run / "checkpoints/step-2/learners/0/adapters" / name, version=2)
        assert [evaluator.due(s) for s in (1, 2, 3, 4)] == [False, True, False, True]
        row = evaluator(generate, ["m0", "m1"])
    finally:
        evaluator.close()
        engine.close()
    assert calls == [3, 3]  # one pass per benchmark: 2 members + the base, one problem each
    assert set(row) == {f"eval/{b}/{m}" for b in ("gsm8k", "humaneval") for m in ("m0", "m1", "base", "population_mean")}
    assert all(0.0 <= v <= 1.0 for v in row.values())
    logs = RunDirectory(tmp_path / "logs")
    logs.append_metrics({"step": 2, **row})
    logs.close()
    assert json.loads((tmp_path / "logs/metrics.jsonl").read_text())["eval/gsm8k/m0"] == row["eval/gsm8k/m0"]
    assert list((tmp_path / "logs/tensorboard").glob("events.out.tfevents.*"))


def test_eval_needs_benchmarks(tmp_path):
    from configs import load_config
    from evaluation.datasets import BenchmarkFileError
    from evaluation.training import TrainingEvaluator

    with pytest.raises(BenchmarkFileError, match="eval.benchmarks is empty"):
        TrainingEvaluator(load_config(None, ["eval.every=5"]), tmp_path)
    with pytest.raises(BenchmarkFileError, match="no file for 'gsm8k'"):
        TrainingEvaluator(load_config(None, ["eval.every=5", "eval.benchmarks=[gsm8k]", f"eval.data={tmp_path}"]), tmp_path)
