"""One options object: ``StudyOptions`` is declared once; ``Study``, ``run_case`` and ``plan_case``
build it from their keyword arguments, and the CLI builds it from one option group. No Ray."""
from __future__ import annotations


import pytest
from typer.testing import CliRunner

import bcer
from bcer.cli import options as O
from bcer.cli.main import app
from bcer.contracts import ErrorCode, ToolError
from bcer.options import StudyOptions


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)
    return result.exit_code, result.output


def test_keyword_settings_and_an_options_object_are_the_same_study(tmp_path):
    opts = StudyOptions.build(task="denoise", out=tmp_path, cache=str(tmp_path / "c"), model_dirs=[tmp_path])
    assert (opts.cache, opts.model_dirs, opts.out) == (tmp_path / "c", (str(tmp_path),), tmp_path)  # paths typed
    by_kwargs = bcer.Study("data", task="denoise", out=tmp_path, cache=tmp_path / "c", model_dirs=[tmp_path])
    by_object = bcer.Study("data", StudyOptions.build(task="denoise", out=str(tmp_path), cache=tmp_path / "c",
                                                      model_dirs=(str(tmp_path),)))
    assert by_kwargs.options == by_object.options
    assert by_kwargs.options.model_dirs == (str(tmp_path),) and by_kwargs.out == tmp_path  # old attribute names read
    # settings on top of an options object; the object itself is not changed
    other = bcer.Study("data", by_object.options, max_in_flight=3)
    assert (other.options.max_in_flight, by_object.options.max_in_flight) == (3, None)
    assert by_object.replace(limit=2).options.limit == 2 and by_object.options.limit is None


def test_unknown_and_out_of_bounds_settings_are_refused():
    with pytest.raises(TypeError, match="max_in_flight"):
        bcer.Study("data", max_in_fligth=2)
    with pytest.raises(ToolError) as e:
        bcer.Study("data", max_in_flight=0)
    assert e.value.code == ErrorCode.schema and "max_in_flight" in e.value.message
    with pytest.raises(TypeError):
        bcer.plan_case("case", task="denoise", bogus=1)


def test_every_group_option_sets_a_study_options_field():
    fields = [f for _, _, f in O.GROUP.values()]
    assert len(fields) == len(set(fields)) and set(fields) <= set(StudyOptions.model_fields)
    for name, (_, default, field) in O.GROUP.items():  # one default per setting: the CLI's is the API's
        if name not in ("planner", "model_dir"):  # the API also takes a planner object; --model-dir a list
            assert default == StudyOptions.model_fields[field].default, name


def test_cohort_options_reach_the_study_as_one_options_object(monkeypatch, tmp_path):
    seen = {}

    class Recorder:
        def __init__(self, data, options):
            seen["data"], seen["options"] = data, options

        def cases(self):
            raise ToolError(ErrorCode.input_missing, "stopped by the test")

    monkeypatch.setattr("bcer.api.Study", Recorder)
    code, out = invoke("cohort", "--data", tmp_path, "--task", "denoise", "--cache", tmp_path / "c",
                       "--node-timeout", "5", "--set", "denoise.nlm.h_factor=0.9", "--case-id", "a", "--case-id", "b",
                       "--max-in-flight", "3", "--no-r4", "--model-dir", tmp_path, "--bundle", "seg.brain_tumor=brats",
                       "--no-derivatives")
    assert code == 2 and "stopped by the test" in out
    assert seen["data"] == tmp_path
    assert seen["options"] == StudyOptions(
        task="denoise", cache=tmp_path / "c", node_timeout_s=5.0, params={"denoise.nlm": {"h_factor": 0.9}},
        case_ids=["a", "b"], max_in_flight=3, r4=False, model_dirs=(str(tmp_path),),
        bundles={"seg.brain_tumor": "brats"}, derivatives=False, planner="offline")


def test_a_malformed_group_value_exits_2_before_anything_runs(tmp_path):
    code, out = invoke("run", "--data", tmp_path, "--task", "denoise", "--bundle", "no-equals-sign")
    assert code == 2 and "is not TOOL=DIR" in out
    code, out = invoke("plan", "--data", tmp_path, "--task", "denoise", "--set", "denoise.nlm.h_factr=0.9")
    assert code == 2 and "h_factor" in out  # did you mean


def test_plan_case_takes_an_options_object_or_its_keywords(tmp_path):
    from bcer.datasets.synth import synth_cohort

    synth_cohort("brain", 1, tmp_path / "d", layout="brats", seed=3, size="small")
    case = bcer.load_cases(tmp_path / "d")[0]
    _, by_kwargs, _ = bcer.plan_case(case, task="denoise", params={"denoise.nlm": {"h_factor": 0.9}})
    _, by_object, _ = bcer.plan_case(case, StudyOptions(task="denoise", params={"denoise.nlm": {"h_factor": 0.9}}))
    assert by_kwargs.model_dump() == by_object.model_dump()
    nlm = [n for n in by_object.nodes if n.tool == "denoise.nlm"]
    assert nlm and nlm[0].params["h_factor"] == 0.9
