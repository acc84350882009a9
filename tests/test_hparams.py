"""The HPARAMS tab as TensorBoard's own plugin reads it, and the steps every tab logs at."""

import hashlib
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_FIT, history, scalars, write_corpus
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups

from callbacks.hparams import METRICS_GROUP, SHORT_LIST, SHOWN, HParamsSummary, machine_name
from lit_attn.cli.lightning_cli import cli
from lit_attn.config import GPTConfig
from lit_attn.tools.run_record import setting

STEPS, VAL_EVERY, LOG_EVERY = 6, 3, 4  # validations after steps 3 and 6; Lightning logs train/loss at step 3 only
ATTENTIONS = ("mha", "sqa")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny fits through the command line, side by side in one runs directory."""
    root = tmp_path_factory.mktemp("runs")
    corpus = write_corpus(root / "corpus.txt")
    for attention in ATTENTIONS:
        args = ["fit", f"--data.path={corpus}", f"--runs_dir={root}", f"--run={attention}", *TINY_FIT,
                f"--model.attention={attention}", f"--trainer.max_steps={STEPS}",
                f"--trainer.val_check_interval={VAL_EVERY}", f"--trainer.log_every_n_steps={LOG_EVERY}",
                "--samples.max_new_tokens=4", "--params.print_table=false"]
        assert cli(args) == 0
    return root


def plugin_view(logdir) -> SimpleNamespace:
    """The experiment and session groups TensorBoard's hparams plugin serves for `logdir`."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    backend = backend_context.Context(
        base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=multiplexer))
    request = context.RequestContext()
    experiment = get_experiment.Handler(request, backend, "", api_pb2.GetExperimentRequest(include_metrics=True)).run()
    statuses = [api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]
    groups = list_session_groups.Handler(request, backend, "", api_pb2.ListSessionGroupsRequest(
        allowed_statuses=statuses, start_index=0, slice_size=100, include_metrics=True)).run()
    return SimpleNamespace(experiment=experiment, groups={g.name: g for g in groups.session_groups})


def test_the_short_list_comes_first_and_its_first_are_ticked(runs):
    infos = plugin_view(runs).experiment.hparam_infos
    names = [info.name for info in infos]
    # The dashboard ticks the hparams that differ: attention, data, heads, layers, width; the short list follows.
    assert {info.name for info in infos if info.differs} == set(SHOWN) == set(names[:len(SHOWN)])
    assert "Data" in SHOWN and set(names[len(SHOWN):len(SHORT_LIST)]) == set(SHORT_LIST) - set(SHOWN)
    # Every other hyperparameter is still there, not under two names.
    assert {"lr", "n_head", "attention_options", "vocab_size"} <= set(names)
    assert not {"attention", "n_layer", "n_embd", "block_size"} & set(names)


def test_metric_columns_are_few_and_read_from_the_run_itself(runs):
    metrics = plugin_view(runs).experiment.metric_infos
    assert [m.name.tag for m in metrics] == [f"whole_run/{m}" for m in (
        "val_loss", "val_acc", "n_params", "time_per_batch", "tokens_per_sec", "train_time")]  # no MFU: no peak on CPU
    assert {m.name.group for m in metrics} == {METRICS_GROUP}
    assert [m.display_name for m in metrics][:3] == ["val loss", "val acc", "parameters"]


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_each_run_is_one_row_with_integers_as_written(runs, attention):
    row = plugin_view(runs).groups[attention]
    values = {name: value.string_value for name, value in row.hparams.items() if value.HasField("string_value")}
    hq, hkv = GPTConfig(vocab_size=2, attention=attention, n_embd=32, n_head=4, block_size=16).heads
    assert values["Attention"] == attention
    corpus = runs / "corpus.txt"  # the data: the file's name, its content's hash, the validation split
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:12]
    assert values["Data"] == f"CharDataModule(corpus.txt, sha256 {digest}, val_fraction=0.1)"
    assert setting(runs / attention, "data") == values["Data"]  # hparams.yaml's, as the tools read it
    assert (values["Hq"], values["Hkv"]) == (str(hq), str(hkv))
    assert (values["Layers"], values["Width"], values["Context"], values["Devices"]) == ("1", "32", "16", "1")
    assert values["Precision"] == "32-true" and values["Batch size"].isdigit()
    threads = torch.get_num_threads()
    assert values["Machine"] == machine_name(torch.device("cpu"))
    assert values["Machine"].endswith(f", {threads} thread" + ("s" if threads > 1 else ""))
    assert values["Seed"] == values["Data seed"] == "1337"  # the data order follows seed_everything
    metrics = {m.name.tag: m for m in row.metric_values}
    assert values["Parameters"] == f"{int(metrics['whole_run/n_params'].value):,}"
    assert metrics["whole_run/val_loss"].value == pytest.approx(scalars(runs / attention, "val/loss")[-1][1])
    assert row.hparams["compile"].bool_value is False and row.hparams["compile"].HasField("bool_value")


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_scalars_samples_and_hparams_share_steps(runs, attention):
    run = runs / attention
    h = history(run)
    val_steps = [s for s, _ in h["val/loss"]]
    assert val_steps == [VAL_EVERY - 1, STEPS - 1]  # the index of the step each validation follows
    assert [s for s, _ in h["samples/text_summary"]] == val_steps
    assert [s for s, _ in h["train/loss"]] == [0, LOG_EVERY - 1, STEPS - 1]  # the first, logging and last steps
    # The whole_run/* scalars are the run's own, at one step; no sub-run doubles the run in TensorBoard's list.
    assert {s for tag in h if tag.startswith("whole_run/") for s, _ in h[tag]} == {STEPS - 1}
    assert [p.parent for p in run.rglob("events.out.tfevents.*")] == [run]
    assert {m.training_step for m in plugin_view(runs).groups[attention].metric_values} == {STEPS - 1}
    (events_file,) = run.glob("events.out.tfevents.*")
    record = [(v.tag, e.step) for e in EventFileLoader(str(events_file)).Load() for v in e.summary.value
              if v.tag.startswith("_hparams_/")]
    assert sorted(record) == [("_hparams_/experiment", STEPS - 1), ("_hparams_/session_end_info", STEPS - 1),
                              ("_hparams_/session_start_info", STEPS - 1)]


def test_the_run_reads_back_its_machine(runs):
    from lit_attn.tools.run_record import read_run

    assert read_run(runs / "mha")["machine"] == machine_name(torch.device("cpu"))


def test_a_run_resumed_on_other_hardware_names_both_machines(monkeypatch):
    """The machines are kept in checkpoints: the final record lists every attempt's; an older checkpoint's state
    (validation values only) still loads."""
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), world_size=1, num_nodes=1)
    first = HParamsSummary()
    monkeypatch.setattr("callbacks.hparams.machine_name", lambda device: "GPU-A")
    first.on_train_start(trainer, None)
    first.on_train_start(trainer, None)  # a second fit on the same machine adds nothing
    state = first.state_dict() | {"val/loss": 2.5}
    resumed = HParamsSummary()
    resumed.load_state_dict(state)
    monkeypatch.setattr("callbacks.hparams.machine_name", lambda device: "CPU-B, 2 threads")
    resumed.on_train_start(trainer, None)
    assert {k: v for k, v in resumed.state_dict().items() if k != "cpu_share"} == {
        "val/loss": 2.5, "machines": ["GPU-A", "CPU-B, 2 threads"]}
    older = HParamsSummary()
    older.load_state_dict({"val/loss": 2.5})
    assert older.state_dict() == {"val/loss": 2.5, "machines": [], "cpu_share": [0.0, 0.0]}
