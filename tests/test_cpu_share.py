"""callbacks.cpu_share: the cores other processes used while a run trained, the warning and the record."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_FIT, write_corpus

from callbacks.cpu_share import CpuShare, machine_cpu_seconds
from callbacks.hparams import HParamsSummary
from lit_attn.cli.lightning_cli import cli


def test_machine_cpu_seconds_reads_the_busy_fields_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal: idle, iowait and steal are not this machine's work
    stat.write_text(f"cpu  {hz} {hz} {2 * hz} {50 * hz} {7 * hz} 0 {hz} {9 * hz} 0 0\ncpu0 1 2 3\n")
    assert machine_cpu_seconds(stat) == 5.0
    assert machine_cpu_seconds(tmp_path / "missing") is None
    stat.write_text("not a stat file\n")
    assert machine_cpu_seconds(stat) is None


class Clocks:
    """A wall clock, the machine's CPU seconds and this process's, moved by hand."""

    def __init__(self) -> None:
        self.wall = self.machine = self.own = 0.0

    def advance(self, seconds: float, others_cores: float, own_cores: float, processes: int = 1) -> None:
        self.wall += seconds
        self.own += own_cores * seconds
        self.machine += (others_cores + own_cores * processes) * seconds

    def share(self, threads: int, processes: int = 1, cores: int = 2) -> CpuShare:
        return CpuShare(threads, processes, cores, window_s=30, clock=lambda: self.wall,
                        machine=lambda: self.machine, own=lambda: self.own)


def test_others_are_the_machines_busy_cores_less_this_runs_processes():
    clocks = Clocks()
    share = clocks.share(threads=1, processes=2)
    share.start()
    clocks.advance(10, others_cores=1.5, own_cores=0.9, processes=2)
    assert share.tick() is None  # within the window: no sample
    clocks.advance(20, others_cores=1.5, own_cores=0.9, processes=2)
    assert share.tick() == pytest.approx(1.5)
    clocks.advance(30, others_cores=0.5, own_cores=1.0, processes=2)
    assert share.tick() == pytest.approx(0.5)
    assert share.others_cores == pytest.approx(1.0)  # the mean over the 60 s sampled
    clocks.advance(1, others_cores=3.0, own_cores=1.0, processes=2)
    assert share.tick() is None and share.tick(last=True) == pytest.approx(3.0)  # the end counts, however short


def test_a_run_shorter_than_one_window_is_not_judged():
    clocks = Clocks()
    share = clocks.share(threads=1)
    share.start()
    clocks.advance(5, others_cores=2.0, own_cores=1.0)
    assert share.tick(last=True) == pytest.approx(2.0)
    assert share.record() == "not measured (under 30 s of training)"


@pytest.mark.parametrize("threads, others, crowded", [
    (1, 0.9, False),  # two one-thread runs on two cores: each has its own core
    (1, 1.9, True),  # ...and a third process beside them
    (2, 0.2, False),  # torch's default, the machine to itself
    (2, 0.9, True),  # two runs with torch's default threads: each waits for the other
])
def test_crowded_when_other_work_takes_cores_the_runs_threads_need(threads, others, crowded):
    clocks = Clocks()
    share = clocks.share(threads=threads)
    share.start()
    clocks.advance(30, others_cores=others, own_cores=threads)
    assert share.crowded(share.tick()) is crowded
    assert share.record() == (f"{others:.1f} of 2 cores" if crowded else "no")
    message = share.warning(others)
    assert message.startswith(f"CPU shared: other processes kept {others:.1f} of this machine's 2 cores busy")
    assert f"{threads} torch thread" in message and "OMP_NUM_THREADS" in message and "\n" not in message


def test_nothing_is_measured_without_proc_stat():
    share = CpuShare(1, machine=lambda: None)
    share.start()
    assert share.tick(last=True) is None and share.record() is None


def test_the_shared_time_adds_up_over_a_resume(monkeypatch):
    clocks = Clocks()
    monkeypatch.setattr("callbacks.hparams.CpuShare", lambda threads, processes: clocks.share(threads, processes))
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), world_size=1, num_nodes=1)
    first = HParamsSummary()
    first.on_train_start(trainer, None)
    clocks.advance(60, others_cores=2.0, own_cores=1.0)
    first.on_train_end(trainer, None)
    resumed = HParamsSummary()
    resumed.load_state_dict(first.state_dict())
    resumed.on_train_start(trainer, None)
    clocks.advance(60, others_cores=0.0, own_cores=1.0)
    resumed.on_train_end(trainer, None)
    assert resumed.state_dict()["cpu_share"] == pytest.approx([120.0, 120.0])  # 1 core on average over both


def test_a_crowded_run_warns_once_and_its_record_and_comparison_say_so(tmp_path, monkeypatch, caplog):
    """A real fit whose machine reads as busy with other work: 3 cores' worth on a 2-core machine."""
    from lit_attn.tools.run_record import read_run

    wall = [0.0]

    def clock() -> float:  # a quarter second passes between any two readings
        wall[0] += 0.25
        return wall[0]

    def share(threads, processes):
        return CpuShare(threads, processes, cores=2, window_s=0.5, clock=clock, machine=lambda: 3.0 * wall[0],
                        own=lambda: 0.0)

    monkeypatch.setattr("callbacks.hparams.CpuShare", share)
    corpus = write_corpus(tmp_path / "corpus.txt")
    with caplog.at_level("INFO"):
        assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", "--run=busy", *TINY_FIT]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU shared:")]
    assert len(warnings) == 1 and "kept 3.0 of this machine's 2 cores busy" in warnings[0]
    row = read_run(tmp_path / "runs" / "busy")
    assert "other processes kept 3.0 of 2 cores busy while it trained: its speeds are not the machine's" in row["notes"]
