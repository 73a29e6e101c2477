"""The NGC TensorRT-LLM container as the alternative launcher.

The native plan's ``launch.sh`` (steps guarded by their skip paths, then ``exec`` the server)
runs inside ``nvcr.io/nvidia/tensorrt-llm/release`` (the tag of the release line the YAML is
written for, :mod:`releases`) with the source material's flags: all GPUs,
host IPC and network, unlimited memlock, a 64 MiB stack, the Hugging Face cache mounted, and
the config folder mounted at the same path so every path in the script holds in both places.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from mathagent.serving.launchers.plan import LaunchPlan, Step


def dockerize(native: LaunchPlan, image: str, out: Path) -> LaunchPlan:
    """Run the native plan's script inside the NGC TensorRT-LLM image."""
    name = f"mathagent-trtllm-{urlsplit(native.health_url).port}"
    cache = str(Path.home() / ".cache" / "huggingface")
    mounts = ["-v", f"{cache}/:/root/.cache/huggingface/", "-v", f"{out}:{out}", "-w", str(out)]
    limits = ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    docker = LaunchPlan("trtllm", native.preset, native.files, [], None, native.health_url)
    docker.notes = list(native.notes)
    if native.server is not None and "trtllm-llmapi-launch" in native.server.argv:
        env = [a for k, v in native.server.env.items() for a in ("-e", f"{k}={v}")]
        docker.steps = [
            Step(
                "on EVERY node: start the TensorRT-LLM container (passwordless SSH between them)",
                ["docker", "run", "-d", "--name", name, "--gpus", "all", "--network", "host",
                 *limits, "--device", "/dev/infiniband:/dev/infiniband", *env, *mounts,
                 image, "sleep", "infinity"],
            ),
        ]  # fmt: skip
        docker.server = Step(
            "on the first node: serve",
            ["docker", "exec", "-e", "HF_TOKEN", name, "bash", f"{out}/launch.sh"],
        )
        docker.notes.append(
            "multi-node docker launches are print-only: run the container step on every node "
            "(NVIDIA's dgx-spark-playbooks trtllm-mn-entrypoint.sh sets up the SSH mpirun needs)"
        )
        docker.runnable = False
        return docker
    docker.server = Step(
        "serve in the NGC TensorRT-LLM image",
        ["docker", "run", "--rm", "--name", name, "-e", "HF_TOKEN", *limits, "--gpus=all",
         "--ipc=host", "--network", "host", *mounts, image, "bash", f"{out}/launch.sh"],
    )  # fmt: skip
    docker.cleanup = ["docker", "rm", "-f", name]
    return docker
