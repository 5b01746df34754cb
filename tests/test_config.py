"""Configuration: presets validate, overrides apply with YAML types, bad keys and values are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs import Config, ConfigError, PRESETS_DIR, dump_config, load_config
from configs.loading import parse_override

PRESETS = sorted(PRESETS_DIR.glob("*.yaml"))


def test_every_preset_is_listed():
    names = {p.name for p in PRESETS}
    assert {"tiny.yaml", "tiny-single.yaml", "tiny-dynamics.yaml", "tiny-dynamics-single.yaml", "qwen2.5-7b-4t4s.yaml",
            "qwen2.5-7b-single.yaml"} <= names


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_validate_and_round_trip(preset: Path, tmp_path: Path):
    config = load_config(preset)
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config))
    assert load_config(saved) == config


def test_default_preset_is_the_tiny_population():
    config = load_config()
    assert config.model.path == "tiny"
    assert (config.population.teachers, config.population.students) == (2, 2)
    assert config.resources.inference_gpus == 0 and config.resources.learner_gpus == 0


def test_paper_preset_is_four_by_four_on_eight_gpus(monkeypatch):
    monkeypatch.setenv("POPULORA_MODEL", "/models/qwen")
    config = load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml")
    assert config.model.path == "/models/qwen"
    assert (config.population.teachers, config.population.students) == (4, 4)
    assert config.resources.inference_gpus + config.resources.learner_gpus == 8


def test_unset_model_variable_stays_visible(monkeypatch):
    monkeypatch.delenv("POPULORA_MODEL", raising=False)
    assert load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml").model.path == "${POPULORA_MODEL}"


def test_single_agent_baseline_is_compute_matched_per_adapter(monkeypatch):
    monkeypatch.setenv("POPULORA_MODEL", "/m")
    pop = load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml")
    single = load_config(PRESETS_DIR / "qwen2.5-7b-single.yaml")
    assert single.population.single_agent and single.population.adapters == 1
    for key in ("tasks_per_teacher", "rollouts_k", "references_k", "code_f_inputs"):
        assert getattr(single.tasks, key) == getattr(pop.tasks, key)
    assert single.lora == pop.lora


@pytest.mark.parametrize("overrides", [[], ["model.tiny_variant=test"]], ids=["as-shipped", "test-variant"])
def test_dynamics_presets_are_the_papers_regime_and_its_compute_matched_single_agent(overrides):
    """configs/tiny-dynamics.yaml (the paper's regime): 4 + 4, one family per teacher and step (groups of 6), the paper's win
    rule, evolution every 25 steps; its single twin does the same per-adapter work with the same model, rl and sampling."""
    pop = load_config(PRESETS_DIR / "tiny-dynamics.yaml", overrides)
    single = load_config(PRESETS_DIR / "tiny-dynamics-single.yaml", overrides)
    assert (pop.population.teachers, pop.population.students, pop.population.single_agent) == (4, 4, False)
    assert pop.tasks.family_rotation == "step" and pop.tasks.tasks_per_teacher == 6
    assert pop.league.unsolved_is_teacher_win and pop.evolution.enabled
    assert (pop.evolution.period, pop.evolution.protection_steps) == (25, 10)
    assert pop.model.tiny_variant == ("test" if overrides else "stronger-large-plus")
    assert single.population.single_agent and single.population.adapters == 1 and not single.evolution.enabled
    for section in ("model", "lora", "tasks", "rewards", "rl", "inference"):
        assert getattr(single, section) == getattr(pop, section), section
    assert single.run.steps == pop.run.steps


def test_family_rotation_is_task_by_default_and_names_its_values():
    assert load_config(None).tasks.family_rotation == "task"
    assert load_config(None, ["tasks.family_rotation=step", "tasks.families=[code_i]"]).tasks.family_rotation == "step"
    with pytest.raises(ConfigError, match="family_rotation"):
        load_config(None, ["tasks.family_rotation=member"])


@pytest.mark.parametrize(
    "text, path, value",
    [
        ("population.teachers=4", ["population", "teachers"], 4),
        ("rl.learning_rate=1e-5", ["rl", "learning_rate"], 1e-5),
        ("tasks.families=[code_o, code_f]", ["tasks", "families"], ["code_o", "code_f"]),
        ("evolution.enabled=false", ["evolution", "enabled"], False),
        ("model.path=/a/b=c", ["model", "path"], "/a/b=c"),
    ],
)
def test_parse_override_types_values(text, path, value):
    assert parse_override(text) == (path, value)


def test_overrides_apply():
    config = load_config(None, ["population.teachers=5", "tasks.families=[code_i]", "evolution.operators.blend_svd.weight=0"])
    assert config.population.teachers == 5
    assert config.tasks.families == ["code_i"]
    assert config.evolution.operators["blend_svd"].weight == 0
    assert config.evolution.operators["blend_svd"].strength == 0.5  # the default strength stays
    assert config.evolution.operators["swap_slots"].weight == 1.0  # the other operators stay


def test_all_operator_weights_zero_is_an_error():
    from configs.schema import CROSSOVER_NAMES, MUTATION_NAMES

    names = [*MUTATION_NAMES, *CROSSOVER_NAMES]
    with pytest.raises(ConfigError, match="every operator weight is 0"):
        load_config(None, [f"evolution.operators.{n}.weight=0" for n in names])


@pytest.mark.parametrize("override, message", [
    ("evolution.operators.extrapolate.strength=0.5", r"extrapolate: strength 0.5 is outside \[1.0, 2.5\]"),
    ("evolution.operators.dare.strength=1.0", r"dare: strength 1.0 is outside \[0.0, 0.99\]"),
    ("evolution.operators.rotate_subspace.strength=2", r"rotate_subspace: strength 2.0 is outside"),
])
def test_operator_strength_outside_its_range_is_an_error_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
    load_config(None, ["evolution.operators.extrapolate.strength=2.5"])  # the range's end is valid


@pytest.mark.parametrize("gpus", [0, 1])
def test_data_parallel_needs_two_learner_gpus(gpus):
    with pytest.raises(ConfigError, match=rf"rl.data_parallel=true .* resources.learner_gpus={gpus} gives each role one "
                                          r"learner: set resources.learner_gpus >= 2 or rl.data_parallel=false"):
        load_config(None, ["rl.data_parallel=true", f"resources.learner_gpus={gpus}"])
    assert load_config(None, ["rl.data_parallel=true", "resources.learner_gpus=2"]).rl.data_parallel


def test_tensor_parallelism_reaches_vllm_once(monkeypatch):
    """resources.tensor_parallel_size is what each engine replica's vLLM gets (with the multiprocessing executor:
    the replica's actor already holds the GPUs), the user's own executor kept; set in vllm_engine_args it is an error."""
    monkeypatch.setenv("POPULORA_MODEL", "/models/qwen")
    preset = PRESETS_DIR / "qwen2.5-7b-4t4s.yaml"
    config = load_config(preset)
    assert config.resources.tensor_parallel_size == 1
    assert config.vllm_engine_args() == config.inference.vllm_engine_args
    tp2 = ["resources.inference_gpus=4", "resources.learner_gpus=4", "resources.tensor_parallel_size=2"]
    config = load_config(preset, tp2)
    assert config.vllm_engine_args() == {**config.inference.vllm_engine_args, "tensor_parallel_size": 2,
                                         "distributed_executor_backend": "mp"}
    config = load_config(preset, [*tp2, "inference.vllm_engine_args.distributed_executor_backend=ray"])
    assert config.vllm_engine_args()["distributed_executor_backend"] == "ray"
    with pytest.raises(ConfigError, match=r"inference.vllm_engine_args.tensor_parallel_size: set resources.tensor_parallel_size"):
        load_config(preset, ["inference.vllm_engine_args.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"resources.tensor_parallel_size=2 splits .* only vllm does; inference.backend='hf'"):
        load_config(preset, [*tp2, "inference.backend=hf"])
    assert load_config(preset, ["inference.backend=hf"]).resources.tensor_parallel_size == 1


def test_an_unknown_required_defence_is_an_error_at_load():
    with pytest.raises(ConfigError, match=r"unknown defence\(s\) \['no_netwrok'\]; known: .*no_network"):
        load_config(None, ["verifier.require=[seccomp, no_netwrok]"])


@pytest.mark.parametrize(
    "override, named, listed",
    [
        ("nonsense.knob=3", "nonsense", "population"),
        ("lora.rnk=8", "lora.rnk", "rank"),
        ("league.pfsp.x=1", "league.pfsp", "pfsp_weighting"),
    ],
)
def test_unknown_keys_are_named_with_the_valid_ones(override, named, listed):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert f"'{named}'" in str(err.value) and listed in str(err.value)


@pytest.mark.parametrize(
    "override, named",
    [
        ("population.teachers=-2", "population.teachers"),
        ("lora.rank=0", "lora.rank"),
        ("league.draw_probability=1.5", "league.draw_probability"),
        ("inference.backend=tpu", "inference.backend"),
        ("tasks.families=[code_x]", "tasks.families"),
        ("tasks.families=[code_o, code_o]", "tasks"),
        ("evolution.operators={warp: {weight: 1}}", "evolution"),
        ("resources={inference_gpus: 3, tensor_parallel_size: 2}", "resources"),
        ("population.single_agent=true", "population"),
    ],
)
def test_bad_values_name_the_key(override, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert named in str(err.value)


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(None, ["population.teachers"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_every_field_has_description_and_numeric_bounds():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, Config.__mro__[1]):
                yield from walk(annotation)
            elif annotation in (int, float):
                bounds = {type(m).__name__ for m in field.metadata}
                assert bounds & {"Ge", "Gt"} and bounds & {"Le", "Lt"}, f"{model.__name__}.{name} is unbounded"
                yield name

    assert len(list(walk(Config))) > 40


def test_learning_off_needs_evolution_off_and_the_advantage_options_are_checked():
    from configs.schema import Config

    with pytest.raises(ValueError, match="evolution.enabled=false"):
        Config.model_validate({"rl": {"train": False}})
    control = Config.model_validate({"rl": {"train": False}, "evolution": {"enabled": False}})
    assert control.rl.learning_rate > 0 and control.rl.log_entropy
    with pytest.raises(ValueError, match="advantage_weighting"):
        Config.model_validate({"rl": {"advantage_weighting": "words"}})
    with pytest.raises(ValueError, match="loss_normaliser"):
        Config.model_validate({"rl": {"loss_normaliser": "max"}})


def test_dotted_settings_are_overrides_that_read_back_to_the_same_config():
    """``dotted_settings`` (MLflow's parameters): one ``key=value`` per setting, each as launch.py takes it, strings
    that YAML would read as something else quoted; all of them together load the configuration they came from."""
    from configs.loading import dotted_settings, override_value, parse_override

    for value in ("tiny", "true", "null", "", "a: b", 3, 0.0005, True, None, ["x", "y"], {}):
        assert parse_override(f"k={override_value(value)}")[1] == value, value
    config = load_config(None, ["population.teachers=3", "inference.vllm_engine_args.max_num_seqs=12",
                                'run.name="true"'])
    settings = dotted_settings(config.model_dump(mode="json"))
    assert settings["population.teachers"] == "3" and settings["run.name"] == '"true"'
    assert settings["inference.vllm_engine_args.max_num_seqs"] == "12"
    assert load_config(None, [f"{k}={v}" for k, v in settings.items()]) == config
