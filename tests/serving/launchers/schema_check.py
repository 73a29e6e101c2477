"""Every preset x engine x version rendering checked against the engines' schema snapshots.

A *refusal* is a key, flag or value the engine version would not take (its snapshot in
``schemas/`` lacks it); a *difference* is a source-material value the default rendering does
not reproduce (``source_material.json``). Renderings the launchers refuse at plan time (a
method an engine or release line lacks) are listed apart with their message: they never start.
``python scripts/preset_audit.py`` prints the figures; ``test_schemas.py`` wants both at 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from mathagent.serving.launchers import sglang, trtllm, vllm
from mathagent.serving.launchers.plan import LaunchPlan, NoEquivalent
from mathagent.serving.launchers.presets import PRESETS, ServePreset
from mathagent.serving.launchers.releases import RELEASES, resolve

HERE = Path(__file__).parent
OUT = Path("/srv/mathagent-audit")
CALIB = "/data/omr-tir.jsonl"


def snapshot(name: str) -> dict:
    return json.loads((HERE / "schemas" / f"{name}.json").read_text())


def source_material() -> dict:
    return json.loads((HERE / "source_material.json").read_text())


def _ready(preset: ServePreset) -> ServePreset:
    if preset.build is None:
        return preset
    return preset.model_copy(
        update={"build": preset.build.model_copy(update={"calib_dataset": CALIB})}
    )


def renderings() -> Iterator[tuple[str, str, LaunchPlan | str]]:
    """(preset, target, plan or the plan-time refusal) for every preset and engine version."""
    engines = {"vllm-0.33.0": vllm.plan, "sglang-0.5.23": sglang.plan}
    for name, preset in PRESETS.items():
        preset = _ready(preset)
        for line in RELEASES:
            for launcher in ("native", "docker"):
                target = f"trtllm-{line}" + ("-docker" if launcher == "docker" else "")
                try:
                    release, _ = resolve(preset, line)
                except NoEquivalent as exc:
                    yield name, target, str(exc)
                    continue
                yield name, target, trtllm.plan(preset, release=release, out=OUT, launcher=launcher)
        for target, render in engines.items():
            try:
                yield name, target, render(preset)
            except NoEquivalent as exc:
                yield name, target, str(exc)


def check_flags(argv: list[str], flags: dict, choices: dict) -> list[str]:
    """Unknown flags, flags missing their value, and values outside the accepted ones."""
    problems, i = [], 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, eq, inline = token.partition("=")
        if name not in flags:
            problems.append(f"unknown flag {name}")
            continue
        if not flags[name].get("takes_value", True):
            continue
        value = inline if eq else (argv[i] if i < len(argv) else None)
        i += 0 if eq else 1
        allowed = choices.get(name) or flags[name].get("choices")
        if value is None:
            problems.append(f"{name} without a value")
        elif allowed is not None and value not in allowed:
            problems.append(f"{name} {value!r} not in {sorted(allowed)}")
    return problems


def check_trtllm_yaml(options: dict, snap: dict) -> list[str]:
    problems, keys = [], snap["llm_args"]["keys"]
    for key, value in options.items():
        if key not in keys:
            problems.append(f"unknown LLM-args key {key}")
        elif isinstance(keys[key], dict):
            problems += [f"unknown key {key}.{k}" for k in value if k not in keys[key]]
    spec = options.get("speculative_config")
    if spec is not None:
        schema, kind = snap["speculative_config"], spec.get("decoding_type")
        if kind not in snap["decoding_types"]:
            problems.append(f"decoding_type {kind!r} not in {snap['decoding_types']}")
        allowed = {"decoding_type", *schema["common_fields"], *schema["draft_keys"]}
        allowed |= set(schema["fields"].get(kind, []))
        problems += [f"unknown speculative_config key {k}" for k in spec if k not in allowed]
    return problems


def _trtllm_commands(plan: LaunchPlan) -> list[list[str]]:
    return [s.argv for s in [*plan.steps, *([plan.server] if plan.server else [])]]


def check_trtllm(plan: LaunchPlan, snap: dict) -> list[str]:
    """The YAML and every trtllm-serve / engine-path command of a native or docker plan."""
    problems = []
    yaml_file = OUT / trtllm.YAML_NAME
    if yaml_file in plan.files:
        import yaml

        problems += check_trtllm_yaml(yaml.safe_load(plan.files[yaml_file]), snap)
    docker = plan.server is not None and plan.server.argv[0] == "docker"
    if docker and snap["image"] not in [a for s in _trtllm_commands(plan) for a in s]:
        problems.append(f"docker image is not {snap['image']}")
    serve = snap["trtllm_serve"]
    tools = snap.get("engine_path") or {}
    for argv in _commands_of(plan):
        if "trtllm-serve" in argv:
            at = argv.index("trtllm-serve") + 1
            rest = argv[at + 1 :] if argv[at : at + 1] == ["serve"] else argv[at:]
            backends = serve["choices"]["--backend"]
            allowed = {"--backend": [*backends["choices"], *backends["aliases"]]}
            problems += check_flags(rest, {key: {} for key in serve["flags"]}, allowed)
        for tool, schema in tools.items():
            if isinstance(schema, dict) and any(a.endswith(tool.rsplit("/", 1)[-1]) for a in argv):
                problems += check_flags(
                    argv, {key: {} for key in schema["flags"]}, schema["choices"]
                )
        if any(a.endswith(("trtllm-build", "convert_checkpoint.py")) for a in argv) and not tools:
            problems.append(f"TensorRT-LLM {snap['version']} has no engine path: {argv[0]}")
    return problems


def _commands_of(plan: LaunchPlan) -> list[list[str]]:
    """The engine's command lines; a docker plan's live in its launch.sh (one per line)."""
    import shlex

    script = plan.files.get(OUT / "launch.sh", "")
    lines = [ln.split("|| ", 1)[-1].removeprefix("exec ") for ln in script.splitlines()]
    return [shlex.split(ln) for ln in lines if ln and not ln.startswith(("#", "set ", "export "))]


def check_argv_engine(argv: list[str], snap: dict, engine: str) -> list[str]:
    """vLLM / SGLang command line against the parser snapshot."""
    body = argv[2:] if engine == "vllm" else argv[3:]
    problems = check_flags(body, snap["flags"], snap.get("value_sets", {}))
    if engine == "vllm" and "--speculative-config" in argv:
        config = json.loads(argv[argv.index("--speculative-config") + 1])
        schema = snap["speculative_config"]
        problems += [
            f"unknown speculative-config key {k}" for k in config if k not in schema["fields"]
        ]
        if config.get("method") not in schema["methods"]:
            problems.append(f"speculative method {config.get('method')!r} not accepted")
    return problems


def refusals(name: str, target: str, plan: LaunchPlan) -> list[str]:
    if target.startswith("trtllm-"):
        return check_trtllm(plan, snapshot(target.removesuffix("-docker")))
    engine = target.split("-")[0]
    snap = snapshot(target)
    return [
        p for s in [*plan.steps, plan.server] if s for p in check_argv_engine(s.argv, snap, engine)
    ]


def _normal(argv: list[str], preset: ServePreset, drop: list[str]) -> list[str]:
    """A command with this plan's folders, the YAML path and user paths put as the source has them."""
    user = {CALIB, *([preset.build.drafter_dir] if preset.build else [])}
    out = []
    for token in argv:
        token = token.replace(f"{OUT}/", "")
        token = "<yaml>" if token == trtllm.YAML_NAME else token
        token = "<user>" if token in user or f"{OUT}/{token}" in user else token
        out.append(token.rsplit("/", 1)[-1] if token.endswith(".py") else token)
    out = out[1:] if out[:1] == ["python3"] else out
    for flag in drop:
        while flag in out:
            del out[out.index(flag) : out.index(flag) + 2]
    return out


def source_differences() -> list[str]:
    """What the default rendering of each sourced preset does not reproduce."""
    import yaml

    found = []
    for name, want in source_material()["presets"].items():
        preset = _ready(PRESETS[name])
        release, _ = resolve(preset, None)
        if release.line != want["trtllm_line"]:
            found.append(
                f"{name}: default line {release.line}, the source runs {want['trtllm_line']}"
            )
        plan = trtllm.plan(preset, release=release, out=OUT)
        yaml_text = plan.files.get(OUT / trtllm.YAML_NAME)
        if yaml.safe_load(yaml_text or "{}") != want.get("yaml", {}):
            found.append(f"{name}: YAML differs from the source")
        drop = want.get("ignore_flags", [])
        commands = [_normal(s.argv, preset, drop) for s in [*plan.steps, plan.server] if s]
        for command in [*want["commands"], want["serve"]]:
            if _normal(command, preset, drop) not in commands:
                found.append(f"{name}: no command {' '.join(command)}")
        if plan.server and want.get("env") and not want["env"].items() <= plan.server.env.items():
            found.append(f"{name}: environment differs from {want['env']}")
    return found


def figures() -> dict:
    """The goal figures: refusals and differences (both should be 0), and plan-time refusals."""
    refused, not_offered, checked = {}, {}, 0
    for name, target, plan in renderings():
        if isinstance(plan, str):
            not_offered[f"{name} @ {target}"] = plan
            continue
        checked += 1
        if problems := refusals(name, target, plan):
            refused[f"{name} @ {target}"] = problems
    differences = source_differences()
    return {
        "renderings_checked": checked,
        "refused_keys_or_flags": sum(len(p) for p in refused.values()),
        "refused": refused,
        "differences_from_source": len(differences),
        "differences": differences,
        "refused_at_plan_time": not_offered,
    }
