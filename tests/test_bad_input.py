"""Bad input from a careless user or an attacker: each gets one early line (exit 2) that names the
option or file and the fix, or is quarantined at ingestion, or escaped where it is written."""

import contextlib
import csv
import io
import os
import struct

import pytest
from commands import run_imagepipe
from conftest import image_bytes, make_class_tree, write

from cli.main import main as cli_main
from components.example_gen import ingest_report
from images.finding import sources
from images.finding.listing import OUTSIDE_ROOT_PROBLEM
from images.image_check import BadImage, Reason, check_and_store
from pipeline.config import PipelineConfig, default_pipeline_name


def run_cli(capsys, *args):
    code = cli_main(list(args))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--image-size", "100000", "--image-size 100000: use 8 to 1024 pixels"),
        ("--image-size", "0", "--image-size 0: use 8 to 1024 pixels"),
        ("--learning-rate", "nan", "--learning-rate nan: use a number above 0 and at most 10"),
        ("--learning-rate", "1000", "--learning-rate 1000.0: use a number above 0 and at most 10"),
        ("--epochs", "1000000000000", "--epochs 1000000000000: use a whole number from 1 to 10,000"),
        ("--batch-size", "0", "--batch-size 0: use a whole number from 1 to 65,536"),
        ("--max-class-drift", "2", "--max-class-drift 2.0: use a fraction from 0 to 1"),
        ("--name", "../elsewhere", "--name '../elsewhere': use letters, digits"),
        # These failed in the Trainer after ~30 s, not naming the option.
        ("--seed", "-1", "--seed -1: use a whole number from 0 to 4,294,967,295"),
        ("--seed", "99999999999999", "--seed 99999999999999: use a whole number from 0 to 4,294,967,295"),
        ("--patience", "0", "--patience 0: use a whole number of epochs from 1 to 10,000"),
        # Echoed whole (a 100 kB line) before the fourth hardening round; argparse's usage dump from Beam's parser.
        ("--model", "m" * 100_000, "argument --model: invalid choice: 'mmmm"),
        ("--seed", "9" * 100_000, "argument --seed: invalid int value: '9999"),
        (
            "--beam-arg=--direct_num_workers=abc",
            None,
            "--beam-arg --direct_num_workers=abc: argument --direct_num_workers: invalid int value: 'abc'",
        ),
    ],
)
def test_bad_training_settings_are_one_line_before_anything_runs(capsys, tmp_path, option, value, expected):
    with pytest.raises(SystemExit) if value and len(value) > 1000 else contextlib.nullcontext():
        code, err = run_cli(capsys, "run", "--root", str(tmp_path / "root"), option, *([value] if value else []))
    if value and len(value) > 1000:  # refused by the parser itself (it exits)
        code, err = 2, capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert len(err[0]) < 700  # a readable line, whatever it echoes
    assert not os.path.exists(tmp_path / "root")  # nothing written


def test_long_or_unknown_values_from_the_environment_are_one_readable_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEPIPE_NAME", "n" * 100_000)
    code, err = run_cli(capsys, "run", "--root", str(tmp_path / "root"))
    assert code == 2 and len(err) == 1 and err[0].startswith("imagepipe: error: --name 'nnnn") and len(err[0]) < 700
    monkeypatch.delenv("IMAGEPIPE_NAME")
    monkeypatch.setenv("IMAGEPIPE_TUNE_MODE", "maybe")
    code, err = run_cli(capsys, "run", "--root", str(tmp_path / "root"))
    assert code == 2 and err == ["imagepipe: error: IMAGEPIPE_TUNE_MODE 'maybe': use search, auto"]


@pytest.mark.parametrize("content", [b"just some notes\n", image_bytes("JPEG"), b""])
def test_a_schema_that_is_not_a_schema_is_refused_before_ingestion(capsys, tmp_path, small_digits, content):
    schema = write(tmp_path / "schema.pbtxt", content)
    code, err = run_cli(capsys, "run", "--root", str(tmp_path / "root"), "--data", small_digits, "--schema", schema)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"imagepipe: error: --schema {schema}: ") and "export-schema" in err[0]
    assert not os.path.exists(tmp_path / "root" / "pipelines")  # refused before any component


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_unwritable_root_names_root(capsys, tmp_path, small_digits, where):
    root = write(tmp_path / "a-file", b"x") if where == "file" else "/proc/imagepipe-root"
    code, err = run_cli(capsys, "run", "--root", root, "--data", small_digits)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"imagepipe: error: --root {root}: cannot write there")


@pytest.mark.parametrize("content", [b"", b"this is not a database" * 10])
def test_a_broken_metadata_store_is_one_line_for_every_command(capsys, tmp_path, small_digits, content):
    name = default_pipeline_name(small_digits)
    store = write(tmp_path / "metadata" / name / "metadata.db", content)
    for args in (
        ["runs", "--root", str(tmp_path)],
        ["report", "--root", str(tmp_path)],
        ["run", "--root", str(tmp_path), "--data", small_digits],
    ):
        code, err = run_cli(capsys, *args)
        assert code == 2 and len(err) == 1, (args, err)
        assert f"{store}: not an ML Metadata store" in err[0] and "move it away" in err[0], (args, err)


def _truncated_store(path) -> str:
    """A real ML Metadata SQLite store (schema and a few records), cut to half its size."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(path)
    store = metadata_store.MetadataStore(config)
    kind = store.put_context_type(metadata_store_pb2.ContextType(name="pipeline_run"))
    store.put_contexts([metadata_store_pb2.Context(type_id=kind, name=f"run-{n}") for n in range(200)])
    del store
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return str(path)


def test_a_truncated_metadata_store_is_one_line_for_every_command(capsys, tmp_path, small_digits):
    """The header is right, the rest is gone: tracebacks in runs and report, a raw error from run after 20 s."""
    store = _truncated_store(tmp_path / "metadata" / default_pipeline_name(small_digits) / "metadata.db")
    for args in (
        ["runs", "--root", str(tmp_path)],
        ["report", "--root", str(tmp_path)],
        ["run", "--root", str(tmp_path), "--data", small_digits],
    ):
        code, err = run_cli(capsys, *args)
        assert code == 2 and len(err) == 1, (args, err)
        assert err[0].startswith(
            f"imagepipe: error: {store}: a damaged ML Metadata store (database disk image is "
            "malformed); restore it from a backup"
        ), (args, err)


def test_a_bad_environment_variable_says_what_it_should_be(capsys, monkeypatch):
    monkeypatch.setenv("IMAGEPIPE_EPOCHS", "ten")
    code, err = run_cli(capsys, "run")
    assert code == 2 and err == [
        "imagepipe: error: IMAGEPIPE_EPOCHS='ten': not a whole number; give a whole "
        "number, or unset the environment variable"
    ]


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        # Empty: it wrote into the current folder.
        ("IMAGEPIPE_ROOT", "", "IMAGEPIPE_ROOT='': empty; give a value, or unset the environment variable"),
        # Not a yes/no value: it was silently false.
        (
            "IMAGEPIPE_DROP_DUPLICATES",
            "maybe",
            "IMAGEPIPE_DROP_DUPLICATES='maybe': not 1 or 0 (true/false, yes/no, on/off)",
        ),
        ("IMAGEPIPE_EVAL_PERCENT", " ", "IMAGEPIPE_EVAL_PERCENT=' ': empty; give a whole number"),
    ],
)
def test_an_empty_or_unknown_environment_value_is_an_error(capsys, monkeypatch, tmp_path, variable, value, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    code, err = run_cli(capsys, "run")
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert os.listdir(tmp_path) == []  # nothing written into the current folder


def test_a_class_name_with_a_newline_is_refused_at_listing(tmp_path):
    make_class_tree(tmp_path / "data", classes=("cat", "dog\nbird"), per_class=2)
    listing = sources.list_source(str(tmp_path / "data"), str(tmp_path / "data"))
    with pytest.raises(sources.DataError, match=r"class name 'dog\\nbird' contains the control character '\\n'"):
        sources.check_usable(listing)


def test_symbolic_links_out_of_the_data_root_are_never_read(tmp_path):
    make_class_tree(tmp_path / "data", per_class=2)
    secret = write(tmp_path / "outside" / "secret.txt", b"password=hunter2")
    os.symlink(secret, tmp_path / "data" / "cat" / "leak.jpg")
    os.symlink("/proc/self/environ", tmp_path / "data" / "dog" / "environ.jpg")
    os.symlink(tmp_path / "outside", tmp_path / "data" / "cat" / "linked-folder")
    os.symlink(tmp_path / "data" / "dog" / "img-0.jpeg", tmp_path / "data" / "cat" / "inside-link.jpeg")
    listing = sources.list_source(str(tmp_path / "data"), str(tmp_path / "data"))
    problems = {c.rel_path: c.problem for c in listing.candidates}
    for rel in ("cat/leak.jpg", "dog/environ.jpg", "cat/linked-folder/secret.txt"):
        assert problems[rel] == (Reason.OUTSIDE_ROOT, OUTSIDE_ROOT_PROBLEM), rel
    assert problems["cat/inside-link.jpeg"] is None  # a link within the data root is fine


def test_quarantine_csv_cells_are_not_spreadsheet_formulas():
    rows = [
        {
            "path": "=cmd|' /C calc'!A0/x.jpg",
            "reason": "not_an_image",
            "detail": "+1",
            "label": "@SUM(A1)",
            "split": "-2",
        }
    ]
    parsed = list(csv.DictReader(io.StringIO(ingest_report.quarantine_csv(rows))))
    assert parsed == [
        {
            "path": "'=cmd|' /C calc'!A0/x.jpg",
            "reason": "not_an_image",
            "detail": "'+1",
            "label": "'@SUM(A1)",
            "split": "'-2",
        }
    ]


def test_predict_csv_results_are_not_spreadsheet_formulas(tmp_path):
    from prediction import result_files

    writer = result_files.ResultWriter(str(tmp_path / "results.csv"), top=1)
    writer.write({"path": "=1+2.png", "predictions": [("=HYPERLINK(1)", 0.9)]})
    writer.write({"path": "@x.png", "error": "-not_an_image"})
    writer.close(complete=True)
    rows = list(csv.reader(open(tmp_path / "results.csv", newline="")))
    assert rows[1:] == [
        ["'=1+2.png", "'=HYPERLINK(1)", "0.900000", "no", ""],
        ["'@x.png", "", "", "", "'-not_an_image"],
    ]


def test_predict_results_on_a_full_disk_are_one_line_and_leave_nothing(tmp_path):
    import subprocess

    from prediction import image_inputs, result_files

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        writer = result_files.ResultWriter(str(full / "results.jsonl"), top=1)
        with pytest.raises(
            image_inputs.InputError,
            match=r"--output .*results.jsonl: cannot write the results "
            r"\(No space left on device\); free space there",
        ):
            for _ in range(1000):  # an OSError traceback, and results.jsonl.partial left behind
                writer.write({"path": "x" * 200, "predictions": [("cat", 0.5)]})
            writer.close(complete=True)
        writer.close(complete=False)  # what the command's cleanup does next: nothing left to do
        assert os.listdir(full) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_named_pipe_manifest_is_one_line_not_a_hang(tmp_path):
    """Opening a FIFO blocks until a writer comes: `run --data pipe.csv` hung forever (predict: test_pipeline)."""
    import subprocess

    from commands import IMAGEPIPE

    os.mkfifo(tmp_path / "pipe.csv")
    done = subprocess.run(
        [IMAGEPIPE, "run", "--data", "pipe.csv", "--root", str(tmp_path / "root")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "pipe.csv: not a regular file" in lines[0] and not (tmp_path / "root").exists(), lines


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A 16x16 JPEG whose frame header (SOF0) claims width x height."""
    data = bytearray(image_bytes("JPEG", size=(16, 16), quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _comment(size: int) -> bytes:
    return b"\xff\xfe" + struct.pack(">H", size + 2) + b"x" * size


@pytest.mark.parametrize("padding", ["none", "comments", "trailer"])
def test_a_jpeg_whose_data_ends_early_is_quarantined_not_stored_grey(padding):
    """The header declares 6000x6000 over the data of a 16x16 image; padded with two 65 KB comment segments
    or 80 KB after the end marker, the file is big enough for the size check, which let it through."""
    data = _jpeg_declaring(6000, 6000)
    if padding == "comments":
        data = data[:2] + _comment(65_000) + _comment(65_000) + data[2:]
    elif padding == "trailer":
        data += b"\0" * 80_000
    with pytest.raises(BadImage) as bad:
        check_and_store(data, 50_000_000, 2_000_000)
    assert bad.value.reason == Reason.TRUNCATED and "cannot hold a 6000x6000 JPEG" in bad.value.detail


def test_real_jpegs_pass_the_scan_data_check():
    """Progressive, restart markers, grayscale, a flat image (the least data per block)."""
    from PIL import Image

    for kw in ({"progressive": True}, {"restart_marker_blocks": 1}, {}):
        check_and_store(image_bytes("JPEG", size=(640, 480), **kw), 50_000_000, 0)
    flat = io.BytesIO()
    Image.new("RGB", (4000, 3000), (250, 250, 250)).save(flat, "JPEG", quality=50)
    check_and_store(flat.getvalue(), 50_000_000, 0)
    check_and_store(image_bytes("JPEG", size=(64, 64), mode="L"), 50_000_000, 0)
    check_and_store(image_bytes("JPEG", size=(16, 16), quality=90), 50_000_000, 2_000_000)  # the real one is fine


def test_a_corrupt_gif_detail_names_no_python_object():
    with pytest.raises(BadImage) as bad:
        check_and_store(b"GIF89a" + b"\x00\x01" * 20, 50_000_000, 0)
    assert "BytesIO" not in bad.value.detail and "0x" not in bad.value.detail


def test_report_out_to_a_folder_is_one_line_and_leaves_nothing(capsys, tmp_path):
    from report import report

    summary = {"run_id": "r1", "started_ms": 0, "status": "complete", "metadata_path": "m", "components": []}
    with pytest.raises(report.ReportError, match="a folder; give a file name"):
        report.build(summary, str(tmp_path))
    with pytest.raises(report.ReportError, match="--out /proc/imagepipe/report.html: cannot write it"):
        report.build(summary, "/proc/imagepipe/report.html")
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["export-schema", "--out", "{tmp}"], "--out {tmp}: a folder; give a file name"),
        (["sample-data", "--out", "{tmp}/file.txt"], "--out {tmp}/file.txt: not a folder; give a folder"),
        (["sample-data", "--out", "/proc/imagepipe-sample"], "--out /proc/imagepipe-sample: cannot write there"),
    ],
)
def test_export_schema_and_sample_data_outputs_are_one_line(capsys, tmp_path, args, expected):
    """These were tracebacks (a folder, an existing file, a read-only file system)."""
    write(tmp_path / "file.txt", b"notes")
    code, err = run_cli(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and len(err) == 1 and expected.format(tmp=tmp_path) in err[0], err
    assert open(tmp_path / "file.txt", "rb").read() == b"notes"


def _device_node(path) -> str:
    """A character device like /dev/null at `path` (as root: mknod), else a named pipe, which the same rule refuses."""
    try:
        os.mknod(str(path), 0o666 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(str(path))
    return str(path)


def test_outputs_are_never_written_over_a_device_or_pipe(capsys, tmp_path, small_digits):
    """`report --out`, `predict --output`, `export-schema --out` and `sample-data --out` onto a device node:
    one line, and the node is still a device (as root it became a regular file)."""
    import stat

    from report import report

    node = _device_node(tmp_path / "mynull")
    kind = stat.S_IFMT(os.stat(node).st_mode)
    summary = {"run_id": "r1", "started_ms": 0, "status": "complete", "metadata_path": "m", "components": []}
    with pytest.raises(report.ReportError, match="not a regular file"):
        report.build(summary, node)
    code, err = run_cli(capsys, "export-schema", "--root", str(tmp_path / "none"), "--out", node)
    assert code == 2 and len(err) == 1 and "not a regular file" in err[0], err
    os.symlink(node, tmp_path / "link.jsonl")  # a link to a device is a device
    code, err = run_cli(
        capsys, "predict", "--model", str(tmp_path), "--output", str(tmp_path / "link.jsonl"), small_digits
    )
    assert code == 2 and len(err) == 1 and "--output" in err[0] and "not a regular file" in err[0], err
    code, err = run_cli(capsys, "sample-data", "--out", node)
    assert code == 2 and len(err) == 1 and "not a folder" in err[0], err
    assert stat.S_IFMT(os.stat(node).st_mode) == kind


def test_config_defaults_keep_the_sample_size(small_digits):
    assert PipelineConfig().hparams().image_size == 32  # None means the default; 0 is refused above


def test_disk_full_during_ingestion_is_one_line(tmp_path, small_digits):
    import subprocess

    artifacts = tmp_path / "root" / "pipelines"
    artifacts.mkdir(parents=True)
    # A full disk, for real: a 100 KB tmpfs where the examples go (needs mount rights; else skipped).
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(artifacts)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        result = run_imagepipe(
            "run", "--root", str(tmp_path / "root"), "--data", small_digits, "--progress", "quiet", timeout=600
        )
    finally:
        subprocess.run(["umount", str(artifacts)], check=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"imagepipe: error: no space left on the device while writing the run's outputs under --root "
        f"{tmp_path / 'root'}; free space there or give a --root on a disk with room, then run again (finished "
        f"steps are cached) (details: {result.stdout.strip().splitlines()[-1][len('report: ') :]})"
    ]


def test_class_mix_drift_is_measured_over_the_classes_both_datasets_have():
    from components import drift

    limits = drift.Thresholds(0.2, 0.3, 0.3, 0.5)
    two = {"examples": 100, "classes": {"cat": 50, "dog": 50}}
    added = drift.compare(two, {"examples": 150, "classes": {"cat": 50, "dog": 50, "bird": 50}}, limits)
    mix = next(c for c in added["checks"] if c["feature"] == "class mix")
    assert added["classes_added"] == ["bird"] and mix["distance"] == 0.0 and not mix["drifted"]
    shrunk = drift.compare(two, {"examples": 100, "classes": {"cat": 95, "dog": 5}}, limits)
    mix = next(c for c in shrunk["checks"] if c["feature"] == "class mix")
    assert mix["drifted"] and mix["distance"] == 0.45
    assert drift.describe_check(mix) in (  # both classes move by 0.45; either is the largest
        "class mix: L-infinity distance 0.450 > 0.200 (largest at 'cat': 50.0% -> 95.0%)",
        "class mix: L-infinity distance 0.450 > 0.200 (largest at 'dog': 50.0% -> 5.0%)",
    )


# --- never a file imagepipe did not write (hardening, third round) ------------------------------------------------


def test_sample_data_never_deletes_or_writes_among_the_users_files(capsys, tmp_path):
    mine = write(tmp_path / "photos" / "holiday" / "beach.jpg", b"my photo")
    write(tmp_path / "photos" / "notes.txt", b"notes")
    code, err = run_cli(capsys, "sample-data", "--out", str(tmp_path / "photos"))
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"imagepipe: error: --out {tmp_path / 'photos'}: the folder holds files imagepipe did not "
        "write, which it never deletes or writes among; give a new or empty folder"
    )
    assert (
        sorted(os.listdir(tmp_path / "photos")) == ["holiday", "notes.txt"] and open(mine, "rb").read() == b"my photo"
    )
    # A folder named like the temporary one is never touched either (it was <out>.partial, removed first).
    keep = write(tmp_path / "digits.partial" / "mine.txt", b"keep")
    os.mkdir(tmp_path / "digits")  # an empty folder is fine
    assert run_cli(capsys, "sample-data", "--out", str(tmp_path / "digits"))[0] == 0
    assert open(keep, "rb").read() == b"keep" and len(os.listdir(tmp_path / "digits" / "7")) > 100
    assert run_cli(capsys, "sample-data", "--out", str(tmp_path / "digits"))[0] == 0  # made before: kept


def test_report_and_schema_outputs_never_overwrite_a_file_imagepipe_did_not_write(capsys, tmp_path):
    from report import report

    summary = {"run_id": "r1", "started_ms": 0, "status": "complete", "metadata_path": "m", "components": []}
    for name, content in (
        ("labels.csv", b"path,label\na.jpg,cat\n"),
        ("saved_model.pb", b"\x08\x01model"),
        ("photo.png", image_bytes("PNG")),
    ):
        target = write(tmp_path / name, content)
        with pytest.raises(
            report.ReportError,
            match=f"--out {target}: the file exists and is not a report imagepipe "
            "wrote, so it is never overwritten; give a new path",
        ):
            report.build(summary, target)
        assert open(target, "rb").read() == content
        code, err = run_cli(capsys, "export-schema", "--root", str(tmp_path / "none"), "--out", target)
        assert code == 2 and len(err) == 1 and "export-schema never replaces an existing file" in err[0], err
        assert open(target, "rb").read() == content
    out = str(tmp_path / "report.html")
    assert report.build(summary, out) == out and report.build(summary, out) == out  # its own report: replaced
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_predict_never_writes_over_its_inputs_other_files_or_into_the_model(capsys, tmp_path):
    manifest = write(tmp_path / "list.csv", b"path\nimg.jpg\n")
    imports = write(tmp_path / "import.jsonl", b'{"imageGcsUri": "gs://b/img.jpg"}\n')
    notes = write(tmp_path / "notes.jsonl", b'{"mine": 1}\n')
    model = tmp_path / "model"
    write(model / "saved_model.pb", b"")
    for args, expected in (
        (["--output", manifest, manifest], f"--output {manifest}: it is one of the inputs"),
        (
            ["--output", str(tmp_path / "r.jsonl"), "--automl-output", imports, imports],
            f"--automl-output {imports}: it is one of the inputs",
        ),
        (["--output", notes, manifest], f"--output {notes}: the file exists and is not a results file"),
        (
            ["--output", str(model / "results.jsonl"), manifest],
            f"--output {model / 'results.jsonl'}: inside the model's folder {model}",
        ),
        (
            ["--output", str(tmp_path / "r.jsonl"), "--automl-output", str(tmp_path / "r.jsonl"), manifest],
            "one file cannot hold both",
        ),
    ):
        code, err = run_cli(capsys, "predict", "--model", str(model), *args)
        assert code == 2 and len(err) == 1 and expected in err[0], (args, err)
    assert open(manifest, "rb").read() == b"path\nimg.jpg\n" and open(notes, "rb").read() == b'{"mine": 1}\n'
    assert sorted(os.listdir(model)) == ["saved_model.pb"]
    from prediction import result_files

    for content, kind in (
        (b'{"path": "a.jpg", "predictions": []}\n', result_files.RESULTS),
        (b"path,class_1,probability_1,unsure,error\n", result_files.RESULTS),
        (b"", result_files.RESULTS),
        (b'{"instance": {"content": "a.jpg"}, "prediction": {}}\n', result_files.AUTOML_RESULTS),
    ):
        assert kind.ours(content)  # a results file predict wrote: replaced by the next run


def test_class_names_in_the_markdown_model_card_are_text_not_markup():
    import markdown

    from components.model_card import render

    hostile = ["<img src=x onerror=alert(1)>", '"><script>alert(1)</script>', "a|b", "[x](javascript:alert(1))"]
    for name in hostile:
        html = markdown.markdown(
            f"- **class**: {render.md_text(name)}\n\n| c |\n|---|\n| {render.md_text(name)} |", extensions=["tables"]
        )
        assert "<img" not in html and "<script" not in html and "<a " not in html, (name, html)
        assert html.count("<td>") == 1  # one cell: a | in a name does not split it


@pytest.mark.parametrize(
    "labels, shown",
    [
        (["dog", "Dog"], "'Dog' and 'dog'"),
        (["dog", "dog\u200b"], "'dog' and 'dog\\u200b'"),
        (["caf\u00e9", "cafe\u0301"], None),  # NFC and NFD: one class already (normalize_label), never refused
        (["\ufb01sh", "fish"], "'fish' and '\ufb01sh'"),  # a ligature (NFKC)
    ],
)
def test_labels_that_read_the_same_are_refused_from_every_source(tmp_path, labels, shown):
    """Class folders, manifest labels and AutoML import labels alike."""
    from images.finding import sources

    labels = [*labels, "cat"] * 2
    rows = [f"gs://b/{n}.jpg,{label}" for n, label in enumerate(labels)]
    write(tmp_path / "import.csv", ("\n".join(rows) + "\n").encode())
    write(
        tmp_path / "manifest.csv",
        ("path,label\n" + "\n".join(f"{n}.jpg,{label}" for n, label in enumerate(labels)) + "\n").encode(),
    )
    for n, label in enumerate(labels):
        write(tmp_path / "tree" / label / f"{n}.jpg", image_bytes(seed=n))
    for source in ("import.csv", "manifest.csv", "tree"):
        listing = sources.list_source(str(tmp_path), str(tmp_path / source))
        if shown is None:
            sources.check_usable(listing)
            continue
        with pytest.raises(sources.DataError, match="differ only by case, Unicode form or invisible characters") as e:
            sources.check_usable(listing)
        assert shown in str(e.value) and "\n" not in str(e.value)


CLOUD = [
    "--project",
    "proj-1",
    "--region",
    "europe-west4",
    "--pipeline-root",
    "gs://bucket-1/pipelines",
    "--image",
    "europe-west4-docker.pkg.dev/proj-1/imagepipe/pipeline:v3",
    "--data",
    "gs://bucket-1/images",
    "--name",
    "pets",
]


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["run", "--data", "s3://bucket/images"],
            "--data s3://bucket/images: imagepipe reads local paths and Cloud "
            "Storage (gs://), not s3://; copy the files",
        ),
        (
            ["run", "--data", "http://example.com/images"],
            "--data http://example.com/images: imagepipe reads local paths",
        ),
        (["predict", "--model", "{tmp}", "s3://bucket/cat.jpg"], "s3://bucket/cat.jpg: imagepipe reads local paths"),
        (["cache", "--root", "{tmp}", "--max-gb", "nan"], "--max-gb nan: give a size in GB (a number, 0 or more)"),
        (["cache", "--root", "{tmp}", "--max-gb", "inf"], "--max-gb inf: give a size in GB (a number, 0 or more)"),
        (["run", "--retune", "--tune", "0"], "--retune with --tune 0: --tune 0 turns the search off"),
        (
            ["submit", "--dry-run", *CLOUD, "--param", "epochs=3", "--param", "epochs=4"],
            "--param epochs: given twice (3 and 4); give it once",
        ),
        (
            ["schedule", "--dry-run", *CLOUD, "--cron", "0 3 * * 1", "--schedule-name", "x" * 5000],
            "--schedule-name 'xxxxxxxx",
        ),
        (
            ["schedule", "--dry-run", *CLOUD, "--cron", "0 3 * * 1", "--schedule-name", "nightly\nrm -rf"],
            "--schedule-name 'nightly\\nrm -rf': not a valid schedule name (1-128 printable characters",
        ),
    ],
)
def test_more_careless_input_is_one_line(capsys, tmp_path, args, expected):
    code, err = run_cli(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and len(err) == 1 and expected.format(tmp=tmp_path) in err[0], err


def test_a_file_uri_is_a_local_path(tmp_path):
    from images.finding import sources
    from pipeline.config import PipelineConfig
    from storage import files

    assert PipelineConfig(data=f"file://{tmp_path}/my%20photos").data == f"{tmp_path}/my photos"
    assert files.local_or_supported("file:///srv/x.jpg", "x") == "/srv/x.jpg"
    write(tmp_path / "cat" / "a.jpg", image_bytes(seed=1))
    write(tmp_path / "rows.csv", f"path,label\nfile://{tmp_path}/cat/a.jpg,cat\ns3://b/x.jpg,dog\n".encode())
    rows = {c.rel_path: c for c in sources.list_source(str(tmp_path), str(tmp_path / "rows.csv")).candidates}
    assert rows["cat/a.jpg"].problem is None  # a file:// row is the local file
    reason, detail = rows["s3://b/x.jpg"].problem
    assert "not s3://" in detail and "pip install" not in detail


def test_submit_without_google_credentials_is_one_line_at_once(capsys, monkeypatch, tmp_path):
    """Found before the Vertex client is made: it looked for credentials in every call, asked the GCE metadata
    server for a while, and failed after 19 s in 26 lines."""
    from pipeline import run_check

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no application default credentials there
    monkeypatch.setattr(run_check, "product_name", lambda: "")  # as off Google Cloud, wherever the test runs
    monkeypatch.setenv("IMAGEPIPE_ROOT", str(tmp_path / "root"))
    code, err = run_cli(capsys, "submit", *CLOUD)
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "imagepipe: error: no Google Cloud credentials found: run 'gcloud auth application-default "
        "login' (or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file), then try again"
    )


def test_a_small_transfer_run_checks_its_labels(tmp_path):
    """40 images: PCA was sized from all rows but fitted on a fold's 32 (ValueError: n_components=39)."""
    import numpy as np

    from components.health import label_issues

    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 20)
    vectors = (rng.normal(size=(40, 1280)) + labels[:, None]).astype(np.float32)
    probabilities = label_issues.probabilities_from_features(vectors, labels, 5, seed=0)
    assert probabilities.shape == (40, 2) and np.allclose(probabilities.sum(axis=1), 1)
