"""``StockadeEnvironment``: a Harbor environment whose trial runs in stockade cells.

``harbor run … --env stockade_harbor:StockadeEnvironment`` (options with
``--ek policy=FILE``, ``--ek image=REF``, ``--ek state=DIR``).

A trial has two phases, and each gets a session (one cell) of its own:

- the **agent phase**, from ``start`` on: the task's ``/tests`` is a decoy
  (``filesystem.deny``), so that an agent that reaches for the hidden tests is
  refused by the kernel and the refusal is recorded, instead of finding an
  empty directory;
- the **verifier phase**, when the verifier uploads ``/tests``: the agent's
  session is closed first (every process it left behind ends, so nothing of the
  agent runs while it is graded), and a fresh one starts without the decoy.

What lasts between them is what Harbor hands over: the task's working
directory, ``/logs`` and ``/solution``, which are directories of the trial on
the host mounted read-write into both cells (``filesystem.mounts``). What the
agent changed elsewhere (a package installed into ``/usr`` of an image) is not
carried over; docs/HARNESSES.md says so.

Files move through the cell, never around it: uploads and downloads are
``write_file``/``read_file`` and ``tar`` inside the session, as the cell's
user, so a symlink the agent planted in ``/logs`` cannot make the harness read
or write a host file. At ``stop`` the record goes to stockade's store and the
bundle (``containment.json``, ``events.jsonl``, ``manifest.json``) to
``<trial>/stockade/`` beside Harbor's own files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import tarfile
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.tar_transfer import extract_dir
from harbor.models.task.config import NetworkMode, NetworkPolicy, TaskOS

from stockade.harness._hosted import SampleHost, start_sample
from stockade.harness._record import SampleRecord, containment_report
from stockade.harness._workbench import Workbench
from stockade.policy import HostRule, MountRule, Policy, default_policy, load_policy

TESTS = "/tests"
HANDED_OVER = ("/logs", "/solution")
"""Directories Harbor moves between its phases (besides the task's workdir)."""
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class StockadeEnvironment(BaseEnvironment):
    """A Harbor trial in stockade workbench sessions (see the module docstring)."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        *args: Any,
        policy: str | None = None,
        image: str | None = None,
        state: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._policy_file = policy
        self._image = image
        self._state = state
        self._workbench: Workbench | None = None
        self._phase = "agent"
        self._record: SampleRecord | None = None
        self._host: SampleHost | None = None
        self._shell = "/bin/bash"
        super().__init__(
            environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs
        )

    @staticmethod
    def type() -> str:
        return "stockade"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # A cell has no network but its own loopback: no-network is what it
        # always is. An allow list is the gateway's (network.allow: names,
        # leading wildcards, addresses, CIDR ranges). A new policy between
        # phases starts the phase's cell again with the new list (what the
        # agent left running ends; the handed-over directories stay).
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities | None:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True)

    def _validate_definition(self) -> None:
        if not self.environment_dir.is_dir():
            raise FileNotFoundError(f"the task has no environment directory {self.environment_dir}")
        if self.task_env_config.os != TaskOS.LINUX:
            raise ValueError(f"the stockade environment runs Linux tasks only, not {self.task_env_config.os}")
        for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
            if (self.environment_dir / name).exists():
                raise ValueError(
                    f"{self.environment_dir / name}: the stockade environment runs one cell per "
                    "trial, not a compose project; give the task one image (a Dockerfile)"
                )
        for policy in (self._network_policy, *self._phase_network_policies):
            self._check_public(policy)

    # ------------------------------------------------------------------ the policy

    def _workdir(self) -> str:
        if self.task_env_config.workdir:
            return str(self.task_env_config.workdir)
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.is_file():
            found = _WORKDIR.findall(dockerfile.read_text(encoding="utf-8", errors="replace"))
            if found:
                return str(found[-1])
        return "/app"

    def _host_root(self) -> Path:
        return Path(self.trial_paths.trial_dir) / "stockade" / "root"

    def _policy(self, phase: str) -> Policy:
        base = load_policy(self._policy_file) if self._policy_file else default_policy("harbor")
        root = self._host_root()
        mounts = []
        for target in (*HANDED_OVER, self._workdir()):
            source = root / target.strip("/").replace("/", "_")
            source.mkdir(parents=True, exist_ok=True)
            mounts.append(MountRule(source=str(source), target=target, mode="rw"))
        if phase == "verifier":
            tests = root / "tests"
            tests.mkdir(parents=True, exist_ok=True)
            mounts.append(MountRule(source=str(tests), target=TESTS, mode="rw"))
        fs = dataclasses.replace(
            base.filesystem,
            mounts=tuple(base.filesystem.mounts) + tuple(mounts),
            deny=tuple(base.filesystem.deny) + ((TESTS,) if phase == "agent" else ()),
        )
        limits = base.limits
        memory = self._effective_memory_mb
        cpus = self._effective_cpus
        limits = dataclasses.replace(
            limits,
            memory=memory * (1 << 20) if memory else limits.memory,
            cpu=float(cpus) if cpus else limits.cpu,
            timeout=None,
        )
        env = dataclasses.replace(base.env, set=tuple(base.env.set) + tuple(self._persistent_env.items()))
        network = base.network
        # "public": what the gateway can honestly give is the operator's own
        # allow list (--ek policy=FILE's network.allow), kept as it is; never
        # every host (the policy loader refuses a bare '*' by design).
        # _check_public refused it already when there is no such list.
        if self._network_policy.network_mode == NetworkMode.ALLOWLIST:
            rules = tuple(HostRule(host=h, ports=(80, 443)) for h in self._network_policy.allowed_hosts)
            network = dataclasses.replace(network, allow=tuple(network.allow) + rules)
        elif self._network_policy.network_mode == NetworkMode.NO_NETWORK:
            network = dataclasses.replace(network, allow=())
        return dataclasses.replace(
            base,
            filesystem=fs,
            limits=limits,
            env=env,
            network=network,
            image=self._image_ref() or base.image,
            user=base.user or "root",
            workdir=self._workdir(),
        )

    def _image_ref(self) -> str | None:
        """The trial's image in the store of the state directory: ``--ek
        image=REF``, else the task's ``docker_image``, else an image named as
        the task (``stockade image build -t NAME environment/``, as the bench
        proctor finds them); None: the host's own system directories."""
        if self._image:
            return self._image
        if self.task_env_config.docker_image:
            return str(self.task_env_config.docker_image)
        from stockade.errors import ImageError
        from stockade.image import default_store

        try:
            default_store(self._state).get(self.environment_name)
        except ImageError:
            return None
        return self.environment_name

    # ------------------------------------------------------------------ lifecycle

    async def start(self, force_build: bool) -> None:
        # The daemon's run and sessions when a daemon runs for the state
        # directory (`stockade ps` lists the trial, its events are stored as
        # they happen); sessions in Harbor's process otherwise (_hosted).
        host = await asyncio.to_thread(
            lambda: start_sample(
                harness="harbor", task=self.environment_name, sample=self.session_id, state=self._state
            )
        )
        self._host = host
        self._record = host.record
        image = self._image_ref()
        self._record.harness_event(
            "harness.trial.start",
            f"harbor task {self.environment_name}: the agent phase starts, "
            + (f"on image {image}" if image else "on the host's system directories (no image in the store)")
            + f" ({host.via})",
            image=image,
            via=host.via,
        )
        if self._network_policy.network_mode == NetworkMode.PUBLIC:
            allow = [rule.host for rule in self._policy("agent").network.allow]
            self._record.harness_event(
                "harness.trial.network",
                f"harbor task {self.environment_name}: network_mode 'public' is given as the "
                f"stockade policy's allow list ({', '.join(allow)}); every other host is refused "
                "and recorded",
                mode="public",
                allowed_hosts=allow,
            )
        await self._open("agent")

    def _upper(self) -> str | None:
        """Where the trial's cells keep the image's upper layer: each phase's
        cell starts from what the last one changed (a package the agent
        installed into /usr is there for the verifier, as in Harbor's one
        container). None without an image: the host's system directories are
        read-only, and what a cell may change is the handed-over directories."""
        if self._image_ref() is None:
            return None
        return str(Path(self.trial_paths.trial_dir) / "stockade" / "upper")

    async def _open(self, phase: str) -> None:
        host = self._host
        assert host is not None
        policy = self._policy(phase)
        upper = self._upper()
        self._workbench = await asyncio.to_thread(lambda: host.open(policy, upper=upper))
        self._phase = phase
        found = await asyncio.to_thread(self._workbench.exec, ["/bin/sh", "-c", "command -v bash"])
        self._shell = found.stdout.decode().strip() or "/bin/sh"
        made = await asyncio.to_thread(
            self._workbench.exec,
            ["/bin/mkdir", "-p", "/logs/agent", "/logs/verifier", "/logs/artifacts"],
        )
        if made.returncode != 0:
            raise RuntimeError(f"cannot make /logs in the stockade cell: {made.stderr.decode().strip()}")

    async def _close_session(self) -> None:
        workbench, self._workbench = self._workbench, None
        if workbench is not None and self._host is not None:
            host = self._host
            await asyncio.to_thread(lambda: host.close(workbench))

    async def stop(self, delete: bool) -> None:
        await self._close_session()
        record = self._record
        if record is None:
            return
        record.harness_event("harness.trial.end", f"harbor task {self.environment_name}: the trial ended")
        assert self._host is not None
        landed = await asyncio.to_thread(self._host.finish)
        report = containment_report(record, landed=landed)
        await asyncio.to_thread(_write_bundle, Path(self.trial_paths.trial_dir) / "stockade", record, report)
        upper = self._upper()
        if delete and upper is not None:
            # The image's changed files (in the image's own ids) are the
            # trial's working state, not its record: gone with the trial.
            await asyncio.to_thread(shutil.rmtree, upper, True)
        self._record = None
        self._host = None

    def _check_public(self, policy: NetworkPolicy) -> None:
        if policy.network_mode != NetworkMode.PUBLIC:
            return
        base = load_policy(self._policy_file) if self._policy_file else None
        if base is None or not base.network.allow:
            _refuse_public(policy)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        self._check_public(network_policy)
        self._network_policy = network_policy
        if self._workbench is None:
            return  # the next phase's cell starts with it
        assert self._record is not None
        set_network = getattr(self._workbench, "set_network", None)
        if set_network is not None:
            # A daemon-hosted session has a gateway of its own: the new list
            # holds from now on, in the same cell (the daemon records
            # session.network); connections open now are ended.
            allow = [_rule_document(rule) for rule in self._policy(self._phase).network.allow]
            hosts = await asyncio.to_thread(set_network, allow)
            self._record.harness_event(
                "harness.trial.network",
                f"harbor task {self.environment_name}: the {self._phase} cell's gateway now allows "
                f"{', '.join(hosts) or 'no host'} (network mode {network_policy.network_mode.value})",
                mode=network_policy.network_mode.value,
                allowed_hosts=list(network_policy.allowed_hosts),
            )
            return
        self._record.harness_event(
            "harness.trial.network",
            f"harbor task {self.environment_name}: the {self._phase} cell starts again with network "
            f"mode {network_policy.network_mode.value}",
            mode=network_policy.network_mode.value,
            allowed_hosts=list(network_policy.allowed_hosts),
        )
        await self._close_session()
        await self._open(self._phase)

    # ------------------------------------------------------------------ exec and files

    def _bench(self) -> Workbench:
        if self._workbench is None:
            raise RuntimeError("the stockade environment is not started; call start() first")
        return self._workbench

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        bench = self._bench()
        who = self._resolve_user(user)
        merged = self._merge_env(env)
        result = await asyncio.to_thread(
            lambda: bench.exec(
                [self._shell, "-c", command],
                cwd=cwd,
                env=merged,
                user=None if who is None else str(who),
                timeout=timeout_sec,
            )
        )
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr.decode("utf-8", "replace")
        if result.timed_out:
            raise TimeoutError(f"the command ran past its timeout of {timeout_sec} s in the stockade cell")
        return ExecResult(stdout=stdout, stderr=stderr, return_code=result.returncode)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = Path(source_path).read_bytes()
        await self._in_cell(
            ["/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", target_path], data
        )

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        if target_dir.rstrip("/") == TESTS and self._phase == "agent":
            await self._verifier_phase()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(source_dir), arcname=".")
        await self._in_cell(
            ["/bin/sh", "-c", 'mkdir -p -- "$1" && tar -xf - --no-same-owner -C "$1"', "sh", target_dir],
            buffer.getvalue(),
        )

    async def _verifier_phase(self) -> None:
        assert self._record is not None
        self._record.harness_event(
            "harness.trial.phase",
            f"harbor task {self.environment_name}: the agent's cell ends, the verifier's starts",
            phase="verifier",
        )
        await self._close_session()
        await self._open("verifier")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        bench = self._bench()
        data = await asyncio.to_thread(bench.read_file, source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        out = await self._in_cell(["/bin/tar", "-cf", "-", "-C", source_dir, "."], None)
        refused = await asyncio.to_thread(extract_dir, io.BytesIO(out), target_dir)
        for why in refused:
            self.logger.warning(f"stockade: a member of {source_dir} was not copied out: {why}")

    async def _in_cell(self, argv: list[str], data: bytes | None) -> bytes:
        bench = self._bench()
        result = await asyncio.to_thread(lambda: bench.exec(argv, input=data, user="root"))
        if result.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(argv[:3])}… failed in the stockade cell (exit {result.returncode}): "
                f"{result.stderr.decode('utf-8', 'replace').strip()}"
            )
        out: bytes = result.stdout
        return out


def _refuse_public(policy: NetworkPolicy) -> None:
    if policy.network_mode == NetworkMode.PUBLIC:
        raise ValueError(
            "the task asks for network_mode 'public', and a stockade cell reaches no network but "
            "its gateway's allowed hosts, never every host; give the hosts the task may reach in "
            "a stockade policy's network.allow (--ek policy=FILE), or set network_mode = "
            '"no-network" or "allowlist" with allowed_hosts under [environment] in task.toml'
        )


def _rule_document(rule: HostRule) -> dict[str, Any]:
    """A ``network.allow`` rule as the policy file spells it (``session.set_network``)."""
    doc: dict[str, Any] = {"host": rule.host, "ports": list(rule.ports)}
    if rule.methods:
        doc["methods"] = list(rule.methods)
    if rule.paths:
        doc["paths"] = list(rule.paths)
    return doc


def _write_bundle(directory: Path, record: SampleRecord, report: dict[str, Any]) -> None:
    """The trial's stockade bundle: the containment report, the log of every
    event, and a manifest of both files' sha256 (so a copy can be checked)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "containment.json": json.dumps(report, indent=2, sort_keys=True).encode() + b"\n",
        "events.jsonl": b"".join(
            json.dumps(e.to_dict(), sort_keys=True).encode() + b"\n" for e in record.events()
        ),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    manifest = {
        "run": record.run_id,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.chmod(directory, 0o755)


__all__ = ["StockadeEnvironment"]
