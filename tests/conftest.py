"""Settings for the whole test process, applied before any test module imports grpc."""

import os
from pathlib import Path

import pytest

# The suite runs gRPC clients and servers in this process and later forks it (PySpark
# launches its JVM with Popen(preexec_fn=...), which forks). gRPC's fork handlers are
# skipped when other threads are inside gRPC at that moment ("skipping fork() handlers")
# and the fork then broke the JVM launch and this process's poller ("epoll_wait error:
# Bad file descriptor"; 17 Spark tests failed once in CI). The forked child only execs
# java, so gRPC needs no fork support here.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# A new node pre-warms its WAL with 64 MiB of filler (~0.3 s, node/log_store.py); the
# suite starts a few hundred fresh nodes, so it runs them without, except where a test
# turns it on (tests/node/test_wal_prewarm.py).
os.environ.setdefault("STREAMWAL_NODE_WAL_PREWARM", "0")


# ---------------------------------------------------------------------- Kubernetes
# One real control plane (etcd + kube-apiserver, tests/control_plane.py) per session,
# started by the first test that asks for it; the run's header and summary name it.

_control_plane: list = []


def pytest_report_header(config) -> str | None:
    from tests.control_plane import assets_dir, binary_version

    apiserver = assets_dir() / "kube-apiserver"
    if not apiserver.exists():
        return f"kube-apiserver: not installed in {assets_dir()} (scripts/setup --test)"
    return f"kube-apiserver: {binary_version(apiserver)} from {assets_dir()}"


_summaries: list[str] = []  # the control planes' lines, from this process or its workers


def _control_plane_lines() -> list[str]:
    return [
        f"kube control plane: kube-apiserver {cp.version}, etcd {cp.etcd_version}, "
        f"at {cp.server}, started once in {cp.started_in:.1f} s"
        for cp in _control_plane
    ]


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its controller prints the line
        workeroutput["control_planes"] = _control_plane_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    _summaries.extend(getattr(node, "workeroutput", {}).get("control_planes", []))


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _summaries + _control_plane_lines():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory):
    from tests.control_plane import ControlPlane, assets_dir

    cp = ControlPlane(assets_dir(), tmp_path_factory.mktemp("control-plane"))
    try:
        cp.start()
    except BaseException:
        cp.stop()
        raise
    _control_plane.append(cp)
    try:
        yield cp
    finally:
        cp.stop()


# ------------------------------------------------------------- serial and parallel
# scripts/test runs the suite in two phases: most tests on two pytest-xdist workers (they
# wait on their processes more than they compute), then, one at a time, the tests whose
# assertions are time promises (writes again within grace + 1 s, trace spans): another
# test's CPU beside them would break the promise, not the code. `--phase` picks one.
SERIAL = ("tests/nemesis/", "tests/bench/test_sched_trace.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=("all", "parallel", "serial"),
        default="all",
        help="all tests (default), or only those that may run beside others, or only the "
        "time-promise tests that run alone (scripts/test runs both phases)",
    )


def _serial(item: pytest.Item) -> bool:
    path = item.path.relative_to(Path(__file__).parent.parent).as_posix()
    return item.get_closest_marker("serial") is not None or path.startswith(SERIAL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = config.getoption("--phase")
    if phase == "all":
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (keep if _serial(item) == (phase == "serial") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
