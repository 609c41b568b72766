"""One run's gateway: the egress proxy and the LLM endpoint on its cell's loopback.

The daemon makes one ``Gateway`` per run and hands it to the run's ``Cell`` as
its ``network``. When the cell's namespaces exist, ``attach`` makes the two
listening sockets inside the cell's network namespace (``stockade._netns``) and
serves them on the daemon's asyncio loop: the cell's programs reach the proxy
and the LLM endpoint on their own 127.0.0.1, while every line of the gateway
runs outside the cell, with the credentials the cell never holds.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Mapping

from stockade._netns import listen_in
from stockade.cell._layers import GATEWAY_PORT, LLM_PORT
from stockade.errors import CellError, PolicyError
from stockade.gateway._ca import RunCA
from stockade.gateway._egress import Egress
from stockade.gateway._options import GatewayOptions
from stockade.gateway._proxy import GatewayHooks, Proxy
from stockade.gateway._resolve import Resolver, make_resolver
from stockade.gateway._secrets import Secrets
from stockade.gateway._upstream import upstream_tls_context
from stockade.policy import LlmPolicy, NetworkPolicy, Policy

PROXY_URL = f"http://127.0.0.1:{GATEWAY_PORT}"
LLM_URL = f"http://127.0.0.1:{LLM_PORT}/v1"
CA_BUNDLE_IN_CELL = "/run/stockade/ca-bundle.pem"
"""The host's trusted roots plus the run's CA, in every cell that has a CA."""
RUN_CA_IN_CELL = "/run/stockade/ca.pem"
"""The run's CA alone (for NODE_EXTRA_CA_CERTS, which adds to Node's own roots)."""
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
"""Debian's trust store: replaced in the cell by the bundle with the run's CA,
so that programs that ignore the variables (and read the file) trust it too."""
ATTACH_TIMEOUT = 10.0


class Gateway:
    """The proxy and the LLM endpoint of one run; single use (one run, its cells).

    Raises (constructor):
        PolicyError: a secret the policy names has no value on this host.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        run_id: str,
        token: str,
        hooks: GatewayHooks,
        loop: asyncio.AbstractEventLoop,
        environ: Mapping[str, str],
        options: GatewayOptions | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        from stockade.llm import LlmEndpoint

        self.run_id = run_id
        self._loop = loop
        self._token = token
        self.secrets = Secrets.load(policy.secrets, environ)
        self.egress = Egress(
            policy.network,
            resolver=resolver or make_resolver(options.dns if options else None),
            inspect_hosts=self.secrets.for_host,
        )
        # The CA exists only where a request must be seen to be judged: a rule
        # on methods or paths, or a secret to put in place of its placeholder.
        inspects = bool(policy.secrets) or any(rule.methods or rule.paths for rule in policy.network.allow)
        self.ca = RunCA.create(run_id) if inspects else None
        self.upstream_tls: ssl.SSLContext = upstream_tls_context(options.upstream_ca if options else None)
        self.proxy = Proxy(
            run_id=run_id,
            egress=self.egress,
            hooks=hooks,
            secrets=self.secrets,
            ca=self.ca,
            upstream_tls=self.upstream_tls,
            hide_echoed_secrets=True,
        )
        self.llm = LlmEndpoint(
            policy.llm or LlmPolicy(),
            run_id=run_id,
            token=token,
            hooks=hooks,
            environ=environ,
            secrets=self.secrets,
            image_url_refused=self._image_url_refused,
        )
        self._attached = 0
        self._closed = False

    def _image_url_refused(self, url: str) -> str | None:
        """Why ``network.allow`` refuses a remote image's URL (which the LLM provider
        fetches, with ``llm.remote_images``), or ``None``: decided as a GET of it."""
        from stockade.gateway._fetch import FetchError, parse_url

        try:
            where = parse_url(url, plain_http=False)
        except FetchError as exc:
            return exc.reason
        decision = self.egress.decide(where.host, where.port, method="GET", path=where.target)
        return None if decision.verdict == "allow" else decision.reason

    async def set_network(self, network: NetworkPolicy) -> None:
        """Enforce ``network`` from now on, in place of the policy's (a session's
        phases: a benchmark's agent and verifier have different rules), and end
        every connection open now, so that a tunnel or a kept-alive request the
        old rules allowed does not outlive them. Call it on the gateway's loop.

        Raises:
            PolicyError: a rule limits methods or paths (its requests must be
                inspected), and this gateway was made without a CA; name
                methods and paths in the policy the session was opened with.
        """
        inspects = any(rule.methods or rule.paths for rule in network.allow)
        if inspects and self.ca is None:
            first = next(r for r in network.allow if r.methods or r.paths)
            raise PolicyError(
                f"network.allow rule for {first.host!r} limits methods or paths, which needs this gateway "
                "to inspect TLS, and it was made without a CA; open the session with a policy whose "
                "network limits methods or paths, or drop them from this rule"
            )
        # One assignment: every decision reads egress.network (its cache of
        # rules by address is keyed by the policy, so it is rebuilt).
        self.egress.network = network
        await self.proxy.drop_connections()

    # ------------------------------------------------------------ CellNetwork

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = PROXY_URL
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
        env["OPENAI_BASE_URL"] = LLM_URL
        env["OPENAI_API_KEY"] = self._token
        if self.ca is not None:
            for name in (
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "PIP_CERT",
                "GIT_SSL_CAINFO",
            ):
                env[name] = CA_BUNDLE_IN_CELL
            env["NODE_EXTRA_CA_CERTS"] = RUN_CA_IN_CELL
        env.update(self.secrets.env())
        return env

    def files(self) -> dict[str, bytes]:
        if self.ca is None:
            return {}
        bundle = _system_roots() + b"\n" + self.ca.cert_pem
        return {CA_BUNDLE_IN_CELL: bundle, RUN_CA_IN_CELL: self.ca.cert_pem, SYSTEM_BUNDLE: bundle}

    def attach(self, cell_id: str, netns_fd: int) -> Callable[[], None]:
        """Serve the proxy and the LLM endpoint inside the cell's namespace.

        Called from the run's thread (never the loop's): it waits for the loop
        to have started serving, so the command never starts before them.

        Raises:
            CellError: the sockets could not be made, or serving did not start.
        """
        if self._closed:
            raise CellError("this run's gateway is closed; a gateway serves one run")
        proxy_sock, llm_sock = listen_in(netns_fd, [("127.0.0.1", GATEWAY_PORT), ("127.0.0.1", LLM_PORT)])
        future = asyncio.run_coroutine_threadsafe(self._serve(proxy_sock, llm_sock, cell_id), self._loop)
        try:
            future.result(ATTACH_TIMEOUT)
        except BaseException as exc:
            future.cancel()
            proxy_sock.close()
            llm_sock.close()
            raise CellError(f"the gateway could not start serving the cell: {exc!r}") from exc
        self._attached += 1
        return self._detach

    async def _serve(self, proxy_sock: socket.socket, llm_sock: socket.socket, cell_id: str) -> None:
        await self.proxy.serve(proxy_sock, cell_id)
        await self.llm.serve(llm_sock, cell_id)

    def _detach(self) -> None:
        self._attached -= 1
        if self._attached > 0:
            return
        future = asyncio.run_coroutine_threadsafe(self.close(), self._loop)
        try:
            future.result(ATTACH_TIMEOUT)
        except Exception:  # the loop is gone (daemon stopping): nothing left to serve
            pass

    async def close(self) -> None:
        """Stop serving and end every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self.proxy.close()
        await self.llm.close()


_ROOTS: bytes | None = None


def _system_roots() -> bytes:
    """The host's trusted roots (read once): the bundle the cell gets starts with them."""
    global _ROOTS
    if _ROOTS is None:
        path = ssl.get_default_verify_paths().cafile or SYSTEM_BUNDLE
        try:
            with open(path, "rb") as f:
                _ROOTS = f.read()
        except OSError:
            _ROOTS = b""
    return _ROOTS


__all__ = ["Gateway", "GatewayOptions"]
