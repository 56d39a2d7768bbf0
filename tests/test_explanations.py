"""Where the model looked: attribution maps from the exported model, in the report (a sample of eval images and each
class's average) and from `imagepipe predict --explain`. The maps are checked against what decides the class: a
planted patch at a random place, and a shortcut (a corner mark on one class only)."""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from browser import open_page
from commands import run_imagepipe
from conftest import write

from bench.planted import make_planted
from components.evaluator import explanations as eval_explanations
from trainer import explain

ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")
RUN = ("--epochs", "30", "--patience", "10", "--image-size", "64", "--accuracy-threshold", "0.5", "--progress", "json")


# --- plain Python ---------------------------------------------------------------------------------------------


def test_a_map_finds_a_box_when_its_top_pixels_are_inside():
    attribution = np.full((64, 64), 0.1, np.float32)
    attribution[10:22, 30:42] = 5.0  # a 12 px patch
    assert explain.top_share_inside(attribution, [30, 10, 42, 22]) == 1.0
    assert explain.top_share_inside(attribution, [0, 0, 12, 12]) == 0.0
    uniform = np.random.default_rng(0).random((64, 64)).astype(np.float32)
    assert explain.top_share_inside(uniform, [30, 10, 42, 22]) < 0.2  # chance: the box's share of the image
    png = explain.overlay_png(np.zeros((64, 64, 3), np.uint8), attribution, 128)
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (128, 128)
        hot = np.asarray(image.convert("RGB"))[20:44, 60:84].mean()
        assert hot > 3 * np.asarray(image.convert("RGB"))[100:124, 0:24].mean()  # the patch glows


def test_the_sample_takes_the_misclassified_first_then_each_class_in_turn():
    rows = (
        [{"correct": True, "predicted": "cat"}] * 10
        + [{"correct": False, "predicted": "dog"}] * 10
        + [{"correct": True, "predicted": "dog"}] * 10
    )
    chosen = eval_explanations.sample(rows, 10)
    assert chosen[:5] == [10, 11, 12, 13, 14]  # at most half of the sample misclassified
    assert chosen[5:] == [0, 20, 1, 21, 2]  # then cat, dog, cat, dog...
    assert eval_explanations.sample(rows, 0) == []


def test_the_sample_is_settled_before_every_eval_image_is_classified_and_is_the_same():
    """The Evaluator classifies eval images only until explanations.settled(): the sample of what it read is the one
    of every image, on random mixes of classes and mistakes (a large eval split costs the images the sample needs)."""
    rng = np.random.default_rng(0)
    stopped_early = 0
    for trial in range(300):
        classes = [f"c{i}" for i in range(int(rng.integers(1, 8)))]
        rows = [
            {"correct": bool(rng.random() > rng.uniform(0.02, 0.4)), "predicted": str(rng.choice(classes))}
            for _ in range(int(rng.integers(0, 400)))
        ]
        limit = int(rng.choice([0, 1, 2, 5, 12, 24]))
        wrong, right, read = 0, {}, len(rows)
        for n, row in enumerate(rows):
            if eval_explanations.settled(wrong, right, limit, classes):
                read = n
                break
            wrong += not row["correct"]
            right[row["predicted"]] = right.get(row["predicted"], 0) + row["correct"]
        everything = eval_explanations.sample(rows, limit)
        # the Evaluator checks between batches of 64: what it read past the point changes nothing either
        assert eval_explanations.sample(rows[:read], limit) == everything, trial
        assert eval_explanations.sample(rows[: read + 63], limit) == everything, trial
        stopped_early += read < len(rows)
    assert stopped_early > 100  # most mixes settle before their last image


# --- a model that decides by a planted patch -------------------------------------------------------------------


@pytest.fixture(scope="module")
def patch_run(tmp_path_factory):
    data = make_planted(str(tmp_path_factory.mktemp("planted") / "patch"), "patch", per_class=150, seed=5)
    root = str(tmp_path_factory.mktemp("patch-root"))
    done = run_imagepipe("run", "--root", root, "--data", os.path.join(data, "images"), *RUN, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {
        "data": data,
        "root": root,
        "events": events,
        "outputs": {c["component"]: c["outputs"] for c in events[-1]["components"]},
    }


@pytest.mark.slow
def test_predict_explain_puts_the_maps_on_the_planted_patch(patch_run, tmp_path):
    """`predict --explain` on a folder and a file: for most images the model gets right, the patch (3.5% of the image)
    holds most of the map's top pixels (measured: 99% of 150 images; the black baseline: 0%)."""
    data, boxes = patch_run["data"], json.load(open(os.path.join(patch_run["data"], "boxes.json")))
    folder = tmp_path / "incoming"
    picked = sorted(boxes)[1::5]
    for rel in picked[1:]:
        write(folder / rel.replace("/", "-"), open(os.path.join(data, "images", rel), "rb").read())
    single = os.path.join(data, "images", picked[0])
    out = tmp_path / "maps"
    done = run_imagepipe(
        "predict", "--root", patch_run["root"], "--explain", str(out), str(folder), single, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "index.csv", newline="")))
    assert len(rows) == len(picked) and (out / ".complete").exists()  # moved into place whole, with its marker
    truth = {os.path.join(data, "images", rel): rel for rel in picked[:1]}
    truth.update({str(folder / rel.replace("/", "-")): rel for rel in picked[1:]})
    right = inside = 0
    for row in rows:
        rel = truth[row["path"]]
        attribution = np.load(out / row["attribution"])
        assert attribution.shape == (64, 64) and abs(float(attribution.sum()) - 1.0) < 1e-3
        assert (out / row["overlay"]).stat().st_size > 0
        if row["class"] == rel.split("/")[0]:
            right += 1
            inside += explain.top_share_inside(attribution, boxes[rel]) > 0.5
    assert right >= 0.9 * len(rows) and inside >= 0.8 * right, (right, inside, len(rows))
    # On Beam (--workers): the same maps, named by a hash of the path (workers know no input order).
    beam_out = tmp_path / "maps-beam"
    done = run_imagepipe(
        "predict",
        "--root",
        patch_run["root"],
        "--workers",
        "2",
        "--output",
        str(tmp_path / "results.jsonl"),
        "--explain",
        str(beam_out),
        str(folder),
        single,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    beam_rows = {r["path"]: r for r in csv.DictReader(open(beam_out / "index.csv", newline=""))}
    assert sorted(beam_rows) == sorted(r["path"] for r in rows) and (beam_out / ".complete").exists()
    for row in rows:
        here, there = np.load(out / row["attribution"]), np.load(beam_out / beam_rows[row["path"]]["attribution"])
        assert np.corrcoef(here.ravel(), there.ravel())[0, 1] > 0.999
    # Never into a folder of the user's files.
    again = run_imagepipe("predict", "--root", patch_run["root"], "--explain", str(folder), single, timeout=600)
    assert again.returncode == 2 and "--explain" in again.stderr and "did not write" in again.stderr
    assert len(os.listdir(folder)) == len(picked) - 1


@pytest.mark.slow
def test_the_report_shows_where_the_model_looked_in_a_real_browser(patch_run):
    evaluation = patch_run["outputs"]["Evaluator"]["evaluation"][0]
    index = eval_explanations.read_index(evaluation)
    assert len(index["images"]) == eval_explanations.LIMIT and len(index["classes"]) == 3
    assert index["seconds"] > 0 and "integrated gradients" in index["method"]
    from runs import run_text

    details = next(c["details"] for c in patch_run["events"][-1]["components"] if c["component"] == "Evaluator")
    assert run_text.describe_explanations(details).startswith(f"; {eval_explanations.LIMIT} eval images explained in")
    check = """(() => { const part = document.getElementById('explanations').parentElement;
        const images = [...part.querySelectorAll('img')];
        return {text: part.innerText, images: images.length,
                loaded: images.filter(i => i.complete && i.naturalWidth > 0).length}; })()"""
    seen = open_page(
        "file://" + patch_run["events"][-1]["report"], check, os.path.join(ARTIFACTS, "report-explanations.png")
    )
    assert seen["errors"] == []
    assert seen["check"]["images"] >= eval_explanations.LIMIT + 3 and seen["check"]["loaded"] == seen["check"]["images"]
    for expected in ("Where the model looked", "Each class, on average", "checks (", "stripes → stripes"):
        assert expected in seen["check"]["text"], expected


@pytest.mark.slow
def test_a_shortcut_shows_in_the_class_map(tmp_path_factory):
    """Two classes of plain photo crops, one with a mark in its top-left corner: the model learns the mark, and that
    class's average map says so (measured: 71% of the map's mass on the 8 px corner, 1.6% of the image)."""
    data = make_planted(str(tmp_path_factory.mktemp("planted") / "shortcut"), "shortcut", per_class=150, seed=6)
    root = str(tmp_path_factory.mktemp("shortcut-root"))
    done = run_imagepipe("run", "--root", root, "--data", os.path.join(data, "images"), *RUN, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    evaluation = {c["component"]: c for c in events[-1]["components"]}["Evaluator"]["outputs"]["evaluation"][0]
    index = eval_explanations.read_index(evaluation)
    marked = next(c for c in index["classes"] if c["name"] == "marked")
    average = np.load(os.path.join(index["folder"], marked["map"]))
    assert float(average[:8, :8].sum()) > 0.4 and explain.top_share_inside(average, [0, 0, 8, 8]) > 0.6


def test_explanations_never_replace_or_write_among_other_folders(tmp_path):
    from prediction import image_inputs, result_files
    from storage import user_files
    from storage.errors import ConfigError

    sample = user_files.write_folder(
        str(tmp_path / "sample"), lambda folder: write(os.path.join(folder, "a.png"), b"x"), "--out"
    )  # a folder imagepipe made, of another kind (sample images)
    with pytest.raises(ConfigError, match="did not write"):
        user_files.FolderWriter(sample, "--explain", result_files.EXPLANATIONS_KIND)
    assert sorted(os.listdir(sample)) == [".complete", "a.png"]  # untouched
    maps = user_files.FolderWriter(str(tmp_path / "maps"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(maps.partial, "1.npy"), b"x")
    maps.close(complete=True)
    again = user_files.FolderWriter(str(tmp_path / "maps"), "--explain", result_files.EXPLANATIONS_KIND)
    again.close(complete=True)  # a folder of maps is replaced whole
    assert sorted(os.listdir(tmp_path / "maps")) == [".complete"]
    # What the user puts in a folder of maps is theirs: the next --explain replaces only what imagepipe wrote.
    write(os.path.join(str(tmp_path / "maps"), "notes.txt"), b"mine")
    write(os.path.join(str(tmp_path / "maps"), "review", "sheet.csv"), b"mine too")
    os.makedirs(tmp_path / "maps" / "empty")
    third = user_files.FolderWriter(str(tmp_path / "maps"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(third.partial, "2.npy"), b"y")
    third.close(complete=True)
    assert sorted(os.listdir(tmp_path / "maps")) == [".complete", "2.npy", "empty", "notes.txt", "review"]
    assert (tmp_path / "maps" / "review" / "sheet.csv").read_bytes() == b"mine too"
    clashing = user_files.FolderWriter(str(tmp_path / "maps"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(clashing.partial, "notes.txt"), b"a map's name")  # would overwrite the user's file
    with pytest.raises(ConfigError, match="notes.txt is not a file imagepipe wrote, and this run writes one"):
        clashing.close(complete=True)
    assert (tmp_path / "maps" / "notes.txt").read_bytes() == b"mine" and (tmp_path / "maps" / "2.npy").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".partial", ".old"))]
    # A folder of the user's under a name this run writes as a file: refused before anything moves, nothing lost.
    write(tmp_path / "maps" / "2.npy.d" / "keep.txt", b"kept")
    under = user_files.FolderWriter(str(tmp_path / "maps"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(under.partial, "2.npy.d"), b"a file where the user has a folder")
    with pytest.raises(ConfigError, match="2.npy.d/keep.txt is not a file imagepipe wrote"):
        under.close(complete=True)
    assert (tmp_path / "maps" / "2.npy.d" / "keep.txt").read_bytes() == b"kept"
    assert (tmp_path / "maps" / "notes.txt").read_bytes() == b"mine"
    # A folder of maps the user emptied (its files deleted, the folder kept) is still imagepipe's to replace.
    sub = user_files.FolderWriter(str(tmp_path / "nested"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(sub.partial, "cat", "1.npy"), b"1")
    sub.close(complete=True)
    os.remove(tmp_path / "nested" / "cat" / "1.npy")
    again_nested = user_files.FolderWriter(str(tmp_path / "nested"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(again_nested.partial, "cat", "2.npy"), b"2")
    again_nested.close(complete=True)
    assert os.listdir(tmp_path / "nested" / "cat") == ["2.npy"]
    # ... but a file of the user's in that folder's place is theirs: refused, kept where it is.
    shutil.rmtree(tmp_path / "nested" / "cat")
    write(tmp_path / "nested" / "cat", b"the user's file")
    in_place = user_files.FolderWriter(str(tmp_path / "nested"), "--explain", result_files.EXPLANATIONS_KIND)
    write(os.path.join(in_place.partial, "cat", "3.npy"), b"3")
    with pytest.raises(ConfigError, match="cat is not a file imagepipe wrote"):
        in_place.close(complete=True)
    assert (tmp_path / "nested" / "cat").read_bytes() == b"the user's file"
    # Two runs into one new folder at once: they take turns at the end, and the last one's maps are there, whole.
    first, second = (
        user_files.FolderWriter(str(tmp_path / "new"), "--explain", result_files.EXPLANATIONS_KIND) for _ in range(2)
    )
    write(os.path.join(first.partial, "a.npy"), b"1")
    write(os.path.join(second.partial, "b.npy"), b"2")
    first.close(complete=True)
    second.close(complete=True)
    assert sorted(os.listdir(tmp_path / "new")) == [".complete", "b.npy"]
    # A link, a path under a file, a folder no one may write, and an earlier imagepipe's folder whose marker does
    # not list its files: one line each, nothing written.
    os.symlink(tmp_path / "maps", tmp_path / "link")
    write(tmp_path / "a-file", b"x")
    earlier = tmp_path / "earlier"
    write(earlier / "1.npy", b"x")
    write(earlier / ".complete", result_files.EXPLANATIONS_KIND.encode())
    for out, message in (
        (tmp_path / "link", "a symbolic link"),
        (tmp_path / "a-file" / "maps", "cannot write there"),
        ("/proc/maps-here", "cannot write there"),
        (earlier, "did not list its files"),
    ):
        with pytest.raises(ConfigError, match=message) as caught:
            user_files.FolderWriter(str(out), "--explain", result_files.EXPLANATIONS_KIND)
        assert "\n" not in str(caught.value)
    for folder in (sample, str(tmp_path)):  # an input, or a folder holding one
        with pytest.raises(image_inputs.InputError, match="a folder of its own"):
            result_files.check_explain_folder(folder, [sample], [], None)
    # A results file named inside the maps folder, not yet written, would go with the folder: refused up front.
    with pytest.raises(image_inputs.InputError, match="a folder of its own"):
        result_files.check_explain_folder(str(tmp_path / "maps"), [], [str(tmp_path / "maps" / "results.csv")], None)
