"""A real, Docker-free Kubernetes control plane for tests.

Tier 1 (:class:`KubeAPIServer`): etcd + kube-apiserver on loopback. No controllers run: nothing
creates ReplicaSets or Pods, nothing garbage-collects, namespaces are never finalized.

Tier 2 (:class:`KubeCluster`): tier 1 + kube-controller-manager + kube-scheduler + kwok and one
fake Node, so Deployments produce Pods that kwok marks Running and Ready.

Both are context managers that yield a :class:`ControlPlane` (kubeconfig path, server URL, bin
dir). Every port is a free loopback port, every file lives in a temporary directory, and on exit
each process group gets SIGTERM, then SIGKILL. The binaries come from
``scripts/build-control-plane.sh`` (see :func:`bin_dir`).
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tether.programs.process_group import GroupProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-control-plane.sh"
#: Set to a directory holding the binaries to skip the build script entirely.
BIN_DIR_ENV = "TETHER_K8S_BIN_DIR"
#: Set to 1 to keep the data directory (logs, certificates, etcd data) after the exit.
KEEP_ENV = "TETHER_KUBE_KEEP"

TIER1_FILES = ("etcd", "kube-apiserver", "kubectl")
TIER2_FILES = (
    *TIER1_FILES,
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kwok-stages.yaml",
)

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"
FAKE_NODE = "kwok-node-0"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
ALWAYS_ALLOW_PATHS = "/healthz,/readyz,/livez,/metrics"
POLL_INTERVAL = 0.1


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


# --------------------------------------------------------------------------------------------
# Binaries


def _missing(directory: Path, names: Sequence[str]) -> list[str]:
    return [name for name in names if not (directory / name).exists()]


def bin_dir(*, build: bool = True, required: Sequence[str] = TIER2_FILES) -> Path:
    """Return the directory with etcd, kube-apiserver, kubectl, KCM, scheduler and kwok.

    ``$TETHER_K8S_BIN_DIR`` wins if set. Otherwise the pinned cache directory named by
    ``scripts/build-control-plane.sh --print-bin-dir`` is used, and the script builds whatever
    is missing there (cold: tens of minutes; needs Go and the Go module proxy).
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        path = Path(override)
        missing = _missing(path, required)
        if missing:
            raise ControlPlaneError(
                f"${BIN_DIR_ENV}={override} lacks {', '.join(missing)}; unset it to use "
                f"{BUILD_SCRIPT.relative_to(REPO_ROOT)}, or point it at a complete directory"
            )
        return path

    printed = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True
    )
    path = Path(printed.stdout.strip())
    if not _missing(path, required):
        return path
    if not build:
        raise ControlPlaneError(
            f"Kubernetes binaries missing in {path}; run {BUILD_SCRIPT.relative_to(REPO_ROOT)}"
        )
    # stderr (progress) goes straight to ours; stdout is the bin dir.
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT.relative_to(REPO_ROOT)} failed with exit code {result.returncode}; "
            "its progress log above says where"
        )
    path = Path(result.stdout.strip().splitlines()[-1])
    missing = _missing(path, required)
    if missing:
        raise ControlPlaneError(f"the build finished but {path} lacks {', '.join(missing)}")
    return path


# --------------------------------------------------------------------------------------------
# Certificates, keys, kubeconfig


@dataclass(frozen=True)
class _Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    #: The API server's client certificate for kubelets (tier 3 trusts ``ca_cert`` for it).
    kubelet_client_cert: Path
    kubelet_client_key: Path


def _write_pem(path: Path, data: bytes, *, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _generate_pki(directory: Path, extra_ips: Sequence[str] = ()) -> _Pki:
    """A throw-away CA, a serving certificate for loopback, the service IP and ``extra_ips``, a
    client certificate for the API server's calls to kubelets, and an SA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tether-test-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str,
        usage: x509.ObjectIdentifier,
        san: Sequence[x509.GeneralName] = (),
        organization: str | None = None,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            subject.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    names: list[x509.GeneralName] = [
        x509.DNSName(name)
        for name in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    ips = ("127.0.0.1", "::1", SERVICE_IP, *extra_ips)
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert, key = leaf("kube-apiserver", ExtendedKeyUsageOID.SERVER_AUTH, names)
    client_cert, client_key = leaf(
        "kube-apiserver-kubelet-client", ExtendedKeyUsageOID.CLIENT_AUTH, (), "system:masters"
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pkcs8 = serialization.PrivateFormat.PKCS8
    no_crypt = serialization.NoEncryption()
    pem = serialization.Encoding.PEM
    return _Pki(
        ca_cert=_write_pem(directory / "ca.crt", ca_cert.public_bytes(pem)),
        serving_cert=_write_pem(directory / "apiserver.crt", cert.public_bytes(pem)),
        serving_key=_write_pem(
            directory / "apiserver.key", key.private_bytes(pem, pkcs8, no_crypt), private=True
        ),
        sa_key=_write_pem(
            directory / "sa.key", sa_key.private_bytes(pem, pkcs8, no_crypt), private=True
        ),
        sa_pub=_write_pem(
            directory / "sa.pub",
            sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo),
        ),
        kubelet_client_cert=_write_pem(
            directory / "kubelet-client.crt", client_cert.public_bytes(pem)
        ),
        kubelet_client_key=_write_pem(
            directory / "kubelet-client.key",
            client_key.private_bytes(pem, pkcs8, no_crypt),
            private=True,
        ),
    )


def _write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> Path:
    # JSON is valid YAML: kubectl, client-go, kopf and the Python clients all read it.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tether-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [
            {
                "name": "tether-test",
                "context": {"cluster": "tether-test", "user": "admin", "namespace": "default"},
            }
        ],
        "current-context": "tether-test",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------------------------
# Processes and polling


def _free_ports(count: int) -> list[int]:
    """Ports the kernel hands out for loopback; all sockets stay open until all are chosen."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class _Process(GroupProcess):
    """A component of the control plane: a child in its own process group, its output in
    `<log_dir>/<name>.log`."""

    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        super().__init__(argv, log=log_dir / f"{name}.log", env=env)

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code}; the end of {self.log}:\n"
                f"{self.log_tail(3000)}"
            )


class _Http:
    """A tiny HTTP(S) client for readiness polls and bootstrap objects; never uses proxies."""

    def __init__(self, base: str, ca_file: Path | None, token: str | None) -> None:
        self.base = base
        if ca_file is None:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=str(ca_file))
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 5.0
    ) -> tuple[int, bytes]:
        """Status and body; status 0 when the server cannot be reached yet."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())
        except (urllib.error.URLError, OSError):
            return 0, b""

    def ok(self, path: str) -> bool:
        return self.request("GET", path)[0] == 200


def _wait_for(
    what: str,
    condition: Callable[[], bool],
    *,
    deadline: float,
    watch: Sequence[_Process],
) -> None:
    """Poll ``condition`` until it holds; fail early if a watched process dies."""
    while True:
        for process in watch:
            process.check_alive()
        if condition():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.log}:\n{p.log_tail(1500)}" for p in watch)
            raise ControlPlaneError(f"timed out waiting for {what}\n{tails}")
        time.sleep(POLL_INTERVAL)


# --------------------------------------------------------------------------------------------
# Public API


@dataclass(frozen=True)
class ControlPlane:
    """What a running control plane offers to tests."""

    kubeconfig: Path
    server: str
    bin_dir: Path
    token: str
    ca_file: Path
    data_dir: Path

    def env(self) -> dict[str, str]:
        """``os.environ`` with ``KUBECONFIG`` pointing here and the bin dir first on ``PATH``."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built with the control plane against it. Its discovery cache is
        this control plane's own: another one, earlier on the same port, may have left its
        own in the user's. A failure says what kubectl printed."""
        command = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.data_dir / 'kubectl-cache'}",
            *args,
        ]
        done = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done


class KubeAPIServer:
    """Tier 1: etcd + kube-apiserver. ``with KubeAPIServer() as cp: ...``."""

    #: Binaries and files this tier needs in the bin dir.
    required: tuple[str, ...] = TIER1_FILES

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        start_timeout: float = 60.0,
        stop_grace: float = 10.0,
        keep_data_dir: bool | None = None,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self._bin_dir = bin_dir
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.keep_data_dir = (
            os.environ.get(KEEP_ENV, "") not in ("", "0")
            if keep_data_dir is None
            else keep_data_dir
        )
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self._processes: list[_Process] = []
        self._data_dir: Path | None = None
        self._plane: ControlPlane | None = None
        self._api: _Http | None = None
        self._failed = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def control_plane(self) -> ControlPlane:
        if self._plane is None:
            raise ControlPlaneError("the control plane is not running")
        return self._plane

    @property
    def pids(self) -> list[int]:
        """Process ids (each also a process group id) of the running components, in start order."""
        return [process.popen.pid for process in self._processes]

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._plane is not None:
            return self._plane
        binaries = self._bin_dir or bin_dir(required=self.required)
        missing = _missing(binaries, self.required)
        if missing:
            raise ControlPlaneError(f"{binaries} lacks {', '.join(missing)}")
        self._data_dir = Path(tempfile.mkdtemp(prefix=self.data_dir_prefix))
        atexit.register(self.stop)
        try:
            self._plane = self._start(binaries, self._data_dir)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self._plane

    def stop(self) -> None:
        atexit.unregister(self.stop)
        # Reverse start order: controllers first, etcd last.
        while self._processes:
            self._processes.pop().stop(self.stop_grace)
        self._plane = None
        if self._data_dir is not None:
            if self.keep_data_dir or self._failed:
                print(f"kube control plane data kept in {self._data_dir}")
            else:
                shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    # -- tier 1 --------------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> _Process:
        process = _Process(name, argv, log_dir, env)
        self._processes.append(process)
        return process

    def _start(self, binaries: Path, data: Path) -> ControlPlane:
        deadline = time.monotonic() + self.start_timeout
        logs = data / "logs"
        logs.mkdir()
        pki = _generate_pki(data / "pki", extra_ips=[self.api_host] if self.api_host else [])
        token = secrets.token_urlsafe(32)
        tokens_file = data / "tokens.csv"
        tokens_file.write_text(f'{token},admin,admin,"system:masters"\n')
        tokens_file.chmod(0o600)

        etcd_port, peer_port, api_port = _free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(binaries / "etcd"),
                "--name=default",
                f"--data-dir={data / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            logs,
        )
        etcd_http = _Http(etcd_url, None, None)
        _wait_for("etcd /health", lambda: etcd_http.ok("/health"), deadline=deadline, watch=[etcd])

        host = self.api_host or "127.0.0.1"
        server = f"https://{host}:{api_port}"
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(binaries / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={api_port}",
                f"--cert-dir={data / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--token-auth-file={tokens_file}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Without pods nothing needs the `kubernetes` Service's endpoints.
                f"--endpoint-reconciler-type={'lease' if self.api_host else 'none'}",
                "--allow-privileged=true",
                "--profiling=false",
                *self._admission_args(),
                *self._kubelet_client_args(pki),
                *self.extra_apiserver_args,
            ],
            logs,
        )
        self._api = _Http(server, pki.ca_cert, token)
        api = self._api
        _wait_for(
            "kube-apiserver /readyz",
            lambda: api.ok("/readyz"),
            deadline=deadline,
            watch=[etcd, apiserver],
        )
        plane = ControlPlane(
            kubeconfig=_write_kubeconfig(data / "kubeconfig", server, pki.ca_cert, token),
            server=server,
            bin_dir=binaries,
            token=token,
            ca_file=pki.ca_cert,
            data_dir=data,
        )
        self._start_more(plane, pki, logs, deadline)
        return plane

    #: An address pods reach the API server on (tier 3); None keeps it on loopback.
    api_host: str | None = None
    data_dir_prefix = "tether-kube-"

    def _kubelet_client_args(self, pki: _Pki) -> list[str]:
        return []

    def _admission_args(self) -> list[str]:
        # No controller-manager: nothing would create the "default" ServiceAccount that the
        # ServiceAccount admission plugin requires for every Pod.
        return ["--disable-admission-plugins=ServiceAccount"]

    def _start_more(self, plane: ControlPlane, pki: _Pki, logs: Path, deadline: float) -> None:
        """Hook for tier 2."""


class KubeCluster(KubeAPIServer):
    """Tier 2: tier 1 + kube-controller-manager + kube-scheduler + kwok with one fake Node."""

    required: tuple[str, ...] = TIER2_FILES

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        start_timeout: float = 120.0,
        stop_grace: float = 10.0,
        keep_data_dir: bool | None = None,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            bin_dir,
            start_timeout=start_timeout,
            stop_grace=stop_grace,
            keep_data_dir=keep_data_dir,
            extra_apiserver_args=extra_apiserver_args,
        )

    def _admission_args(self) -> list[str]:
        return []  # the controller-manager creates the default ServiceAccounts

    def _start_more(self, plane: ControlPlane, pki: _Pki, logs: Path, deadline: float) -> None:
        self._start_controllers(plane, pki, logs, deadline)
        self._start_kwok(plane, logs, deadline)

    def _controller_manager_args(self) -> list[str]:
        return []

    def _start_controllers(
        self, plane: ControlPlane, pki: _Pki, logs: Path, deadline: float
    ) -> None:
        """kube-controller-manager and kube-scheduler; returns once they answer and the default
        ServiceAccount exists."""
        binaries, data, kubeconfig = plane.bin_dir, plane.data_dir, str(plane.kubeconfig)
        kcm_port, scheduler_port = _free_ports(2)
        delegated = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--authorization-always-allow-paths={ALWAYS_ALLOW_PATHS}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                str(binaries / "kube-controller-manager"),
                *delegated,
                f"--secure-port={kcm_port}",
                f"--cert-dir={data / 'kcm-certs'}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--cluster-name=tether-test",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                *self._controller_manager_args(),
            ],
            logs,
        )
        self._spawn(
            "kube-scheduler",
            [
                str(binaries / "kube-scheduler"),
                *delegated,
                f"--secure-port={scheduler_port}",
                f"--cert-dir={data / 'scheduler-certs'}",
            ],
            logs,
        )
        insecure = {
            "kube-controller-manager": _Http(f"https://127.0.0.1:{kcm_port}", None, None),
            "kube-scheduler": _Http(f"https://127.0.0.1:{scheduler_port}", None, None),
        }
        for name, client in insecure.items():
            _wait_for(
                f"{name} /healthz", _healthz(client), deadline=deadline, watch=self._processes
            )
        api = self._api
        assert api is not None
        _wait_for(
            "ServiceAccount default/default (controller-manager)",
            lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
            deadline=deadline,
            watch=self._processes,
        )

    def _start_kwok(self, plane: ControlPlane, logs: Path, deadline: float) -> None:
        binaries, data, kubeconfig = plane.bin_dir, plane.data_dir, str(plane.kubeconfig)
        (kwok_port,) = _free_ports(1)
        kwok_env = dict(os.environ)
        kwok_env["KWOK_WORKDIR"] = str(data / "kwok")  # ignore any ~/.kwok/kwok.yaml
        self._spawn(
            "kwok",
            [
                str(binaries / "kwok"),
                f"--config={binaries / 'kwok-stages.yaml'}",
                f"--kubeconfig={kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={'='.join(KWOK_ANNOTATION)}",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{kwok_port}",
            ],
            logs,
            kwok_env,
        )

        api = self._api
        assert api is not None
        status, body = api.request("POST", "/api/v1/nodes", _fake_node(FAKE_NODE))
        if status != 201:
            raise ControlPlaneError(f"creating Node {FAKE_NODE} failed ({status}): {body!r}")

        watch = [*self._processes]
        kwok_http = _Http(f"http://127.0.0.1:{kwok_port}", None, None)
        _wait_for("kwok /healthz", _healthz(kwok_http), deadline=deadline, watch=watch)
        _wait_for(
            f"Node {FAKE_NODE} Ready (kwok)",
            lambda: _node_ready(api, FAKE_NODE),
            deadline=deadline,
            watch=watch,
        )


def _healthz(client: _Http) -> Callable[[], bool]:
    return lambda: client.ok("/healthz")


def _fake_node(name: str) -> dict[str, Any]:
    key, value = KWOK_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
            },
        },
        # No taint: ordinary Deployments from the tests schedule here without tolerations.
        "spec": {},
    }


def _node_ready(api: _Http, name: str) -> bool:
    status, body = api.request("GET", f"/api/v1/nodes/{name}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


__all__ = [
    "BIN_DIR_ENV",
    "BUILD_SCRIPT",
    "KEEP_ENV",
    "TIER1_FILES",
    "TIER2_FILES",
    "ControlPlane",
    "ControlPlaneError",
    "KubeAPIServer",
    "KubeCluster",
    "bin_dir",
]
