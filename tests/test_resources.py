"""Options that ask for what the machine has are checked against it before anything is created, and a bad
value of any option ends in one line naming its flag."""

from __future__ import annotations

import re
import types
import typing

import pytest
from helpers import snapshot
from test_ranges import numeric_options

import lit_attn.cli.lightning_cli as main
from datamodules import CharDataModule, MQARDataModule, PasskeyDataModule, WikipediaDataModule
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.resources import PATHS, RESOURCES

TINY = ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16",
        "--data.batch_size=4", "--trainer.enable_progress_bar=false", "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2"]
MQAR = ["--data=MQARDataModule", "--data.input_seq_len=16", "--data.num_kv_pairs=2", "--data.vocab_size=32",
        "--data.num_train_examples=64", "--data.num_test_examples=8"]
GIB = 2**30


@pytest.fixture
def machine(monkeypatch):
    """A CPU machine with 2 cores and 1 GiB of memory, started by no cluster launcher."""
    monkeypatch.setattr("lit_attn.cli.resources.cpu_cores", lambda: 2)
    monkeypatch.setattr("lit_attn.cli.resources.gpu_count", lambda: 0)
    monkeypatch.setattr("lit_attn.cli.resources.physical_memory", lambda: GIB)
    for name in ("NODE_RANK", "MASTER_ADDR", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_NAME", "LOCAL_RANK",
                 "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def refused(tmp_path, capsys, *args: str) -> str:
    """The one error line of a fit with `args`, after checking it left nothing behind."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 80)
    runs = tmp_path / "runs"
    before = snapshot(tmp_path)
    try:
        code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", *TINY, *args])
    except SystemExit as e:  # the parser's own exit, on a value it cannot read
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before  # no run directory, no cache, nothing
    return lines[0]


# ---- the machine's resources (part of every fit, main.py and sweeps alike: they go through cli) ----

MANY = 10**12


@pytest.mark.parametrize("args,expected", [
    (["--trainer.accelerator=cpu", "--trainer.devices=4096"],
     "--trainer.devices 4096: this machine has 2 CPU cores; use --trainer.devices <= 2, or a GPU machine"),
    (["--trainer.devices=4096"], "--trainer.devices 4096: this machine has 2 CPU cores"),  # accelerator auto
    ([f"--trainer.devices={MANY}"], f"--trainer.devices {MANY}: this machine has 2 CPU cores"),
    (["--trainer.accelerator=cpu", "--trainer.devices=[0]"],
     "--trainer.devices [0]: device indices pick GPUs, and the CPU accelerator has none"),
    (["--trainer.devices=0,1"], "--trainer.devices [0, 1]: device indices pick GPUs"),
    ([f"--trainer.num_nodes={MANY}"], "--trainer.num_nodes must be an integer in [1, 65536]"),
    (["--trainer.num_nodes=2"], "--trainer.num_nodes 2: this process was not started by a cluster launcher"),
    (["--data.num_workers=64"], "--data.num_workers 64: 64 DataLoader worker processes, but this process may use "
                                "2 CPU cores; use --data.num_workers <= 2"),
    ([f"--data.num_workers={MANY}"], f"--data.num_workers {MANY}:"),
    ([f"--samples.max_new_tokens={MANY}"], f"--samples.max_new_tokens {MANY}: a sample of"),
    (["--samples.max_new_tokens=100000000"], "more than this machine's 1.0 GiB; use --samples.max_new_tokens <= "
                                             "53,687,091"),
    ([*MQAR, f"--data.num_train_examples={MANY}"], f"--data.num_train_examples {MANY} and --data.num_test_examples "
                                                   "8 of 16-token sequences: the examples need 465.7 TiB of memory"),
    ([*MQAR, f"--data.num_test_examples={MANY}"], "more than this machine's 1.0 GiB; draw fewer examples"),
    (["--run=" + "r" * 300], "--run: the name 'rrrrrrrrrrrrrrrrrrrr'... is 300 bytes long; the filesystem of"),
    (["--runs_dir="], "--runs_dir is empty; name a directory"),
    (["--run="], "--run '' is not a plain name"),
    (["--ckpt_path="], "--ckpt_path is empty; name a checkpoint file"),
    (["--data.path="], "--data.path is empty; name a text file"),
    (["--data.cache_dir="], "--data.cache_dir is empty; name a directory"),
    (["--trainer.barebones=true"], "--trainer.barebones true turns off the logger, checkpoints and callbacks"),
    (["--data.block_size=16"], "--data.block_size is set by --model.block_size"),
    (["--data.init_args.block_size", "8"], "--data.init_args.block_size is set by --model.block_size"),
    (["--seed_everything=-1"], "--seed_everything must be an integer in [0, 4294967295]"),
    ([f"--seed_everything={MANY}"], "--seed_everything must be an integer in [0, 4294967295]"),
])
def test_asking_for_more_than_the_machine_has_is_refused_in_one_line(args, expected, machine, tmp_path, capsys):
    line = refused(tmp_path, capsys, *args)
    assert expected in line, line


def test_a_cache_dir_that_is_a_file_is_refused(machine, tmp_path, capsys):
    (tmp_path / "cache").write_text("a file")
    assert "--data.cache_dir" in refused(tmp_path, capsys, f"--data.cache_dir={tmp_path / 'cache'}")


@pytest.mark.parametrize("args,expected", [
    (["--trainer.accumulate_grad_batches", str(MANY)],
     f"--trainer.accumulate_grad_batches {MANY}: more batches than an epoch's 806, so each optimizer step would "
     "take a whole epoch; use --trainer.accumulate_grad_batches <= 806"),
    (["--trainer.limit_train_batches=10", "--trainer.accumulate_grad_batches=11"],
     "--trainer.accumulate_grad_batches 11: more batches than an epoch's 10"),
    (["--trainer.fast_dev_run", str(MANY)],
     f"--trainer.fast_dev_run {MANY}: a debug run longer than the data, which has 806 training batch(es) per epoch"),
])
def test_a_schedule_that_cannot_step_or_outruns_the_data_is_refused(args, expected, machine, tmp_path, capsys):
    line = refused(tmp_path, capsys, *args)
    assert expected in line, line


@pytest.mark.parametrize("args", [["--trainer.devices=2"], ["--data.num_workers=2"], ["--trainer.num_nodes=1"]])
def test_what_the_machine_has_is_accepted(args, machine, monkeypatch):
    from lit_attn.cli.resources import check_resources

    cfg = parsed(monkeypatch, *args)
    check_resources(cfg)


def test_a_launched_multi_node_fit_is_left_to_the_launcher(machine, monkeypatch):
    from lit_attn.cli.resources import check_resources

    cfg = parsed(monkeypatch, "--trainer.num_nodes=4")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "head")
    check_resources(cfg)


def test_gpu_counts(machine, monkeypatch):
    from lit_attn.cli.resources import check_resources

    monkeypatch.setattr("lit_attn.cli.resources.gpu_count", lambda: 2)
    for args, message in ([["--trainer.devices=8"], "--trainer.devices 8: this machine has 2 GPU(s)"],
                          [["--trainer.devices=[0, 3]"], "--trainer.devices [0, 3]: this machine has 2 GPU(s)"]):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_resources(parsed(monkeypatch, "--trainer.accelerator=gpu", *args))
    check_resources(parsed(monkeypatch, "--trainer.accelerator=gpu", "--trainer.devices=[0, 1]"))


def parsed(monkeypatch, *args: str):
    """The `fit` config of `args`, as parsed, before anything is checked or built."""
    captured = {}

    class Parsed(Exception):
        pass

    def capture(self, parser, args):
        parser_args = parser.parse_args(args) if args is not None else None
        captured["cfg"] = parser_args[parser_args["subcommand"]]
        raise Parsed

    monkeypatch.setattr(main.LitAttnCLI, "parse_arguments", capture)
    with pytest.raises(Parsed):
        main.main(["fit", *args])
    return captured["cfg"]


# ---- messages that name the flag ----

@pytest.mark.parametrize("args,expected", [
    (["--data.batch_size=abc"], "--data.batch_size must be an integer >= 1 (windows per batch (per device)), "
                                "got 'abc'"),
    (["--data.batch_size="], "--data.batch_size must be an integer >= 1 (windows per batch (per device)), got ''"),
    (["--data.val_fraction=x"], "--data.val_fraction must be a number in (0, 1) ("),
    (["--data.stride=1.5"], "--data.stride must be an integer >= 1 (train windows start every `stride` characters "
                            "(1 = every offset)), got 1.5"),
    (["--data.val_stride="], "--data.val_stride must be an integer >= 1 or null ("),
    (["--data.num_workers=x"], "--data.num_workers must be an integer >= 0 (DataLoader worker processes), got 'x'"),
    (["--data.seed=abc"], "--data.seed must be an integer in [0, 4294967295] or null ("),
    ([*MQAR, "--data.power_a=abc"], "--data.power_a must be a number > 0 ("),
    ([*MQAR, "--data.test_settings=abc"], "--data.test_settings='abc' is invalid: expected list[tuple[int, int]]"),
    (["--data.nonexistent=3"], "--data.nonexistent is not an option of CharDataModule"),
])
def test_a_bad_data_value_names_its_flag(args, expected, tmp_path, capsys):
    line = refused(tmp_path, capsys, *args)
    assert expected in line and "NestedArg" not in line and "--data=" not in line, line


@pytest.mark.parametrize("content,expected", [
    (b"\xff\xfe\x00binary", "is not UTF-8 text (byte 0xff at offset 0); give a YAML file"),
    (b"trainer: {max_steps: [1,\n", "is not valid YAML (line 2, column 1)"),
    (b"data:\n  init_args:\n    block_size: 8\n", "sets data block_size 8, which --model.block_size sets"),
])
def test_a_broken_config_file_is_named(content, expected, tmp_path, capsys):
    config = tmp_path / "my.yaml"
    config.write_bytes(content)
    line = refused(tmp_path, capsys, f"--config={config}")
    assert f"--config {config} " in line and expected in line, line


def _data_class_of(name: str) -> str:
    for cls in (CharDataModule, MQARDataModule, WikipediaDataModule, PasskeyDataModule):
        if name in typing.get_type_hints(cls.__init__):
            return cls.__name__
    raise AssertionError(f"no datamodule has {name}")


DATA_NUMBERS = sorted(key.rpartition(".")[2] for key in numeric_options()
                      if key.startswith("data.init_args.") and key != "data.init_args.block_size")


@pytest.mark.parametrize("name", DATA_NUMBERS)
@pytest.mark.parametrize("value", ["abc", ""])
def test_every_numeric_data_option_names_its_flag_for_a_value_that_is_no_number(name, value, tmp_path, capsys):
    line = refused(tmp_path, capsys, f"--data={_data_class_of(name)}", f"--data.{name}={value}")
    assert f"--data.{name} must be " in line and line.endswith(f", got {value!r} (--help lists the flags)"), line


def test_a_config_file_is_checked_as_the_flags_are(machine, tmp_path, capsys):
    config = tmp_path / "big.yaml"
    config.write_text("trainer:\n  accelerator: cpu\n  devices: 4096\ndata:\n  init_args:\n    num_workers: 64\n")
    line = refused(tmp_path, capsys, f"--config={config}")
    assert "--trainer.devices 4096: this machine has 2 CPU cores" in line, line


@pytest.mark.parametrize("extra,expected", [
    (["--trainer.devices=4096"], "--trainer.devices 4096: this machine has 2 CPU cores"),
    (["--data.num_workers=64"], "--data.num_workers 64:"),
    (["--data.batch_size=abc"], "--data.batch_size must be an integer >= 1"),
    ([f"--samples.max_new_tokens={MANY}"], f"--samples.max_new_tokens {MANY}:"),
])
def test_a_sweeps_run_is_checked_as_main_py_is(extra, expected, machine, tmp_path, capsys):
    """A sweep run is `python -m lit_attn fit` with the arguments after `--`: the same checks (run in-process here)."""
    from lit_attn.tools import sweep

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 80)
    command = sweep.fit_command("mha", "s-mha", str(tmp_path / "runs"), [], [f"--data.path={corpus}", *TINY, *extra],
                                seed=1)
    assert command[:4] == [*sweep.LAUNCH, "fit"]
    before = snapshot(tmp_path)
    try:
        code = cli(command[3:])
    except SystemExit as e:  # the parser's own exit
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and expected in err.strip().splitlines()[-1] and "Traceback" not in err
    assert snapshot(tmp_path) == before


# ---- every option has a rule ----

def test_every_numeric_option_says_which_resource_it_counts():
    assert sorted(numeric_options() ^ set(RESOURCES)) == []


def _text(tp) -> bool:
    if tp is str:
        return True
    return typing.get_origin(tp) in (typing.Union, types.UnionType, list) and any(_text(a) for a in typing.get_args(tp))


def test_every_path_option_is_refused_when_empty():
    names = ("path", "dir", "file", "files", "tokenizer", "url", "dataset", "dataset_config")
    options = {"runs_dir", "run", "ckpt_path"}
    for cls in (CharDataModule, WikipediaDataModule, MQARDataModule):
        options |= {f"data.init_args.{name}" for name, tp in typing.get_type_hints(cls.__init__).items()
                    if _text(tp) and name.endswith(names)}
    assert sorted(options - set(PATHS)) == []
