"""TensorRT-LLM release lines: the NGC image, the YAML spelling and the methods of each.

One table decides, per release line, the image tag the docker launcher runs and the spelling
the YAML is written in, so the two are always chosen together. Every line from 1.0 to 1.3
accepts the source material's ``decoding_type: Eagle`` with ``speculative_model_dir`` (1.3
also reads ``Eagle3``/``speculative_model``; 1.2.0rc6 and older refuse those), so that is the
spelling written for all of them. ReDrafter needs the engine path (``trtllm-build``), which is
deprecated from the 1.3 line on; presets name the lines they run on.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass

from mathagent.serving.launchers.plan import NoEquivalent
from mathagent.serving.launchers.presets import ALTERNATIVES, Method, ServePreset

IMAGE_REPO = "nvcr.io/nvidia/tensorrt-llm/release"


@dataclass(frozen=True)
class Release:
    """One TensorRT-LLM release line as the launchers render for it."""

    line: str  # "1.3"
    tag: str  # the NGC image tag: "1.3.0rc12"
    eagle_decoding_type: str = "Eagle"
    draft_key: str = "speculative_model_dir"
    engine_path: bool = True  # trtllm-build / convert_checkpoint.py / --backend tensorrt

    @property
    def image(self) -> str:
        """The NGC release image of this line."""
        return f"{IMAGE_REPO}:{self.tag}"


RELEASES = {
    r.line: r
    for r in (
        Release("1.0", "1.0.0"),
        Release("1.1", "1.1.0rc0"),  # the ReDrafter recipe's tensorrt_llm==1.1.0rc0
        Release("1.2", "1.2.0rc6"),
        Release("1.3", "1.3.0rc12", engine_path=False),  # the playbook's image
    )
}


def line_of(version: str) -> str:
    """The release line (``"1.2"``) of a version string such as ``1.2.0rc6``; refuses others."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a TensorRT-LLM version: {version!r}")
    line = f"{int(match[1])}.{int(match[2])}"
    if line not in RELEASES:
        known = ", ".join(RELEASES)
        raise ValueError(
            f"TensorRT-LLM {version} has no schema here (known release lines: {known}); "
            "pass --trtllm-version with one of them"
        )
    return line


def installed_version() -> str | None:
    """The installed ``tensorrt_llm`` version, read from package metadata (no import, no GPU)."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _image_line(image: str | None) -> str | None:
    tag = image.rsplit(":", 1)[1] if image and ":" in image.rsplit("/", 1)[-1] else ""
    return line_of(tag) if re.match(r"v?\d+\.\d+", tag) else None


def resolve(
    preset: ServePreset, requested: str | None, image: str | None = None
) -> tuple[Release, str]:
    """The release to render for and where that choice came from; refuses what cannot run.

    Order: ``--trtllm-version``, else the ``--image`` tag, else the installed ``tensorrt_llm``,
    else the preset's default (the source material's line). A version and an image tag of
    different lines, or a line without the preset's method, are refused here, before anything
    is written, downloaded or started.
    """
    from_image = _image_line(image)
    if requested:
        line, source = line_of(requested), f"--trtllm-version {requested}"
        if from_image is not None and from_image != line:
            raise ValueError(
                f"--image {image} is TensorRT-LLM {from_image}, but --trtllm-version asks for "
                f"{requested}: the YAML is written for the image, so name one line"
            )
    elif from_image is not None:
        line, source = from_image, f"image tag {image.rsplit(':', 1)[1]}"  # type: ignore[union-attr]
    elif (found := installed_version()) is not None:
        line, source = line_of(found), f"installed tensorrt_llm {found}"
    else:
        line, source = preset.trtllm_default, "the preset's default line"
    _check_line(preset, line)
    return RELEASES[line], source


def _check_line(preset: ServePreset, line: str) -> None:
    spec = preset.speculation
    if preset.trtllm_lines is not None and line not in preset.trtllm_lines:
        offer = ALTERNATIVES.get(preset.name)
        hint = f"; for {line} use --preset {offer}" if offer else ""
        raise NoEquivalent(
            f"{preset.name} runs on TensorRT-LLM {', '.join(preset.trtllm_lines)} only "
            f"(its engine path, trtllm-build, is deprecated from 1.3 on){hint}"
        )
    if spec is not None and spec.method is Method.redrafter and not RELEASES[line].engine_path:
        raise NoEquivalent(
            f"TensorRT-LLM {line} has no ReDrafter engine path (trtllm-build); "
            "use --trtllm-version 1.0, 1.1 or 1.2"
        )
