"""Wide runs (workers/wide.py, issue 44): a lone request runs on the model's idle workers' cores too.

The plan (which cores, how many threads) and the choice (the other seats of the board idle or not)
are pure functions, tested on fake boards (lists); the setting's validation and start-up words
in process; a real server with the slow test model: a lone request says `wide` in Server-Timing
and counts in the metric, one that arrives while another worker is busy does not. No timings.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from onnxpool import hooks
from onnxpool.config.loader import ConfigError, load_settings
from onnxpool.workers.cores import CpuAllowance, plan_layout
from onnxpool.workers.lanes import Board, Seats
from onnxpool.workers.session import SessionRuntime
from onnxpool.workers.wide import LENT_NICE, Seat, WidePlan, choose_threads, describe_setting, plan_wide, wide_threads
from tests.harness import Server, proc_status, running_server
from tests.slow_model import build_slow_model, infer_body, server_settings
from tests.test_faults import INFER, slow_in_flight

# --- the plan ---------------------------------------------------------------------------------


def test_two_pinned_workers_each_lend_the_other_core() -> None:
    layout = plan_layout([0, 1], "auto", "auto")
    first, second = plan_wide(layout, "auto", 0), plan_wide(layout, "auto", 1)
    assert first == WidePlan(2, (0, 1)) and second == WidePlan(2, (1, 0))
    # onnxruntime numbers processors from 1; the calling thread stays on the worker's own core
    assert first.affinities == "2" and second.affinities == "1"


def test_a_wide_run_takes_the_next_cores_after_its_own_share() -> None:
    layout = plan_layout([4, 5, 6, 7], 2, 2)  # 2 workers x 2 threads
    plan = plan_wide(layout, "auto", 1)
    assert plan is not None and plan.threads == 4 and plan.cores == (6, 7, 4, 5)
    assert plan.affinities == "8;5;6"
    narrower = plan_wide(plan_layout([0, 1, 2, 3], "auto", "auto"), 3, 2)
    assert narrower is not None and narrower.threads == 3 and narrower.affinities == "4;1"


def test_no_wide_session_where_it_cannot_be_wider() -> None:
    two = plan_layout([0, 1], "auto", "auto")
    assert plan_wide(two, "off", 0) is None
    assert plan_wide(plan_layout([0, 1], 1, "auto"), "auto", 0) is None  # one worker owns every core already
    assert plan_wide(plan_layout([0, 1, 2, 3], 2, 2), 2, 0) is None  # no wider than its own share
    assert wide_threads(two, 16) == 2  # never more than the model's cores


def test_unpinned_layout_leaves_the_threads_to_the_kernel() -> None:
    layout = plan_layout(CpuAllowance(affinity=tuple(range(8)), quota=2.5), "auto", "auto")
    plan = plan_wide(layout, "auto", 0)
    assert not layout.pinned and plan == WidePlan(2, ()) and plan.affinities == ""  # floor(quota), not the mask


# --- the choice, on a fake board ----------------------------------------------------------------


def test_wide_only_while_every_other_seat_is_idle() -> None:
    plan = WidePlan(2, (0, 1))
    assert choose_threads(plan, [1, 0, 0], seat=0) == 2  # its own work does not count
    assert choose_threads(plan, [0, 0, 0], seat=0) == 2
    assert choose_threads(plan, [1, 1, 0], seat=0) == 0  # another worker is working: narrow
    assert choose_threads(plan, [1, 0, 3], seat=0) == 0
    assert choose_threads(None, [0, 0, 0], seat=0) == 0  # no wide session


def test_a_seat_marks_itself_on_the_shared_board_and_the_master_clears_it() -> None:
    board = Board()
    seats = Seats(board)
    mine, other = Seat(board, seats.acquire(1), WidePlan(2, (0, 1))), Seat(board, seats.acquire(2), None)
    assert mine.threads() == 2
    with other.working(), other.working():  # a request, and its inference inside it
        assert board.working[other.seat] == 1 and mine.threads() == 0  # marked once, however deep
        with mine.working():
            assert mine.threads() == 0
    assert board.working[other.seat] == 0 and mine.threads() == 2
    mine.enter(queued=True)  # a request of its own that found connections waiting behind it: load
    assert mine.threads() == 0
    mine.leave(queued=True)
    assert mine.threads() == 2
    board.working[other.seat] = 1  # a worker killed mid-request...
    seats.release(2)  # ...is cleared by the master's child_exit
    assert mine.threads() == 2


class ListenersNotToBeRead:
    @property
    def sockets(self) -> list[object]:
        raise AssertionError("pre_request looked at the listen queues")


def test_no_marks_and_no_select_where_no_worker_runs_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = SessionRuntime()  # loaded without a seat: wide_threads off, one worker, no wider share
    monkeypatch.setattr(hooks, "RUNTIME", runtime)
    request = SimpleNamespace()
    hooks.pre_request(ListenersNotToBeRead(), request)
    assert not runtime.runs_wide and not hasattr(request, hooks.QUEUED_ATTRIBUTE)


# --- the setting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["auto", "off", "2", "16"])
def test_the_setting_takes_auto_off_and_a_width(value: str) -> None:
    settings = load_settings(environ={"ONNXPOOL_MODEL__WIDE_THREADS": value}).settings
    assert settings.model.wide_threads == (int(value) if value.isdigit() else value)


@pytest.mark.parametrize("value", ["1", "0", "-2", "sometimes"])
def test_the_setting_refuses_what_is_no_width(value: str) -> None:
    with pytest.raises(ConfigError, match="wide_threads"):
        load_settings(environ={"ONNXPOOL_MODEL__WIDE_THREADS": value})


def test_the_default_is_auto_and_the_start_up_words_say_what_it_does() -> None:
    assert load_settings(environ={}).settings.model.wide_threads == "auto"
    two = plan_layout([0, 1], "auto", "auto")
    assert describe_setting(two, "auto") == "wide runs 2 threads when the other workers are idle (wide_threads=auto)"
    assert describe_setting(two, "off") == "wide runs off (wide_threads=off)"
    assert describe_setting(plan_layout([0, 1], 1, "auto"), "auto") == "wide runs off (one worker)"


# --- a real server ----------------------------------------------------------------------------------


def wide_of(reply: requests.Response) -> str | None:
    """The `wide` metric of the reply's Server-Timing (its threads), None for a narrow run."""
    reply.raise_for_status()
    found = re.search(r'wide;desc="(\d+) threads"', reply.headers["Server-Timing"])
    return found.group(1) if found else None


def wide_runs(server: Server) -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    found = re.search(r'^onnxpool_wide_runs_total\{model="slow"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def thread_ids_of(pid: int) -> list[str]:
    return sorted(p.name for p in Path(f"/proc/{pid}/task").iterdir())


def cores_of(pid: int, tid: str) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def nice_of(pid: int, tid: str) -> int:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of stat(5); fields[0] is field 3


def two_slow_workers(model: Path, wide: str = "auto") -> dict[str, str]:
    return server_settings(model) | {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_MODEL__WIDE_THREADS": wide}


@pytest.mark.slow
def test_a_lone_request_runs_wide(tmp_path: Path) -> None:
    model = build_slow_model(tmp_path / "models" / "slow.onnx")
    with running_server(tmp_path, two_slow_workers(model), workers=2) as server:
        assert "wide runs 2 threads when the other workers are idle (wide_threads=auto)" in server.log()
        assert server.log().count("wide=2 threads") == 2  # each worker's ready line
        for pid in server.workers():  # its wide session's pool thread: on the other core, at LENT_NICE
            own = proc_status(pid)["Cpus_allowed_list"]
            lent = [tid for tid in thread_ids_of(pid) if cores_of(pid, tid) != own]
            assert len(lent) == 1 and nice_of(pid, lent[0]) == LENT_NICE
        lone = [wide_of(requests.post(server.url + INFER, json=infer_body(10), timeout=10)) for _ in range(3)]
        assert lone == ["2", "2", "2"]
        assert wide_runs(server) == 3


@pytest.mark.slow
def test_a_request_beside_a_busy_worker_runs_narrow(tmp_path: Path) -> None:
    model = build_slow_model(tmp_path / "models" / "slow.onnx")
    with slow_in_flight(tmp_path, model) as run:  # 2 workers; one is stuck in a long inference
        server = run.server
        beside = [wide_of(requests.post(server.url + INFER, json=infer_body(10), timeout=10)) for _ in range(3)]
        assert beside == [None, None, None]
        assert wide_runs(server) == 0  # the stuck one ran wide (it was alone) but has not ended


@pytest.mark.slow
def test_wide_off_runs_every_request_narrow(tmp_path: Path) -> None:
    model = build_slow_model(tmp_path / "models" / "slow.onnx")
    with running_server(tmp_path, two_slow_workers(model, "off"), workers=2) as server:
        assert "wide runs off (wide_threads=off)" in server.log() and server.log().count("wide=off") == 2
        assert wide_of(requests.post(server.url + INFER, json=infer_body(10), timeout=10)) is None
