"""Data health on generated data: near-duplicates found at ingestion (real Beam, real images), likely label
errors ranked by confident learning (real cleanlab on real images), the checks' thresholds."""

import csv
import io
import os

import numpy as np
import pytest
from conftest import write
from example_gen_helpers import read_examples, run_executor
from PIL import Image

from bench.corpus import _photo
from components.example_gen import NEAR_DUPLICATES_FILE, QUARANTINE_FILE
from components.health import checks, label_issues

ORIGINALS = 40  # distinct photos: crops of two sample photos, so many share a scene


def _photos(count: int):
    from sklearn.datasets import load_sample_images

    sources = load_sample_images().images
    return [_photo(np.random.default_rng([7, n]), [sources[n % 2]]) for n in range(count)]


def _encode(image: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def _copies(data: bytes):
    """The edits a near-duplicate survives: {kind: bytes}."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    return {
        "resized": _encode(image.resize((w // 2, h // 2), Image.BILINEAR), quality=90),
        "recompressed": _encode(image, quality=40),
        "cropped": _encode(image.crop((w * 4 // 100, h * 4 // 100, w - w * 4 // 100, h - h * 4 // 100)), quality=90),
        "png": _encode(image, "PNG"),
    }


@pytest.fixture(scope="module")
def near_tree(tmp_path_factory):
    """train/<class>/ and eval/<class>/: 40 distinct photos in train, 4 in eval; copies of 8 of the training
    ones in eval (resized, recompressed, cropped), a PNG copy of one in train, and a copy of one under the other class (a conflict)."""
    root = tmp_path_factory.mktemp("near") / "data"
    photos = _photos(ORIGINALS + 4)
    classes = ("china", "flower")
    expected = []  # (original, copy) relative paths
    for n, data in enumerate(photos):
        write(root / ("train" if n < ORIGINALS else "eval") / classes[n % 2] / f"photo-{n:03d}.jpg", data)
    for n in range(8):
        kind = ("resized", "recompressed", "cropped")[n % 3]
        label = classes[n % 2]
        rel = f"eval/{label}/copy-{n:03d}-{kind}.jpg"
        write(root / rel, _copies(photos[n])[kind])
        expected.append((f"train/{label}/photo-{n:03d}.jpg", rel))
    write(root / "train" / "flower" / "photo-011.png", _copies(photos[11])["png"])
    expected.append(("train/flower/photo-011.jpg", "train/flower/photo-011.png"))
    write(root / "train" / "flower" / "relabelled-010.jpg", _copies(photos[10])["recompressed"])  # 010 is china
    expected.append(("train/china/photo-010.jpg", "train/flower/relabelled-010.jpg"))
    return str(root), expected


def _groups(report_uri):
    with open(os.path.join(report_uri, NEAR_DUPLICATES_FILE), newline="") as f:
        rows = list(csv.DictReader(f))
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], set()).add(row["path"])
    return list(groups.values()), rows


def test_resized_recompressed_and_cropped_copies_are_found_and_distinct_photos_are_not(near_tree, tmp_path):
    data, expected = near_tree
    examples, report = run_executor(data, tmp_path, layout="presplit")
    groups, rows = _groups(report.uri)
    # Every copy is grouped with its original, and no group holds two distinct photos.
    assert sorted(sorted(g) for g in groups) == sorted(sorted(pair) for pair in expected)
    summary = _summary(report)
    assert summary["near_duplicate_groups"] == 10 and summary["near_duplicate_files"] == 20
    assert summary["near_duplicate_eval_leaks"] == 8  # 8 of the 12 eval images copy a training one
    assert summary["near_duplicate_eval_leak_fraction"] == pytest.approx(8 / 12)
    assert summary["near_duplicate_conflicts"] == 1 and summary["near_duplicate_within_class"] == 9
    conflict = summary["near_duplicate_examples"][0]  # conflicts are shown first
    assert {label for _, label, _ in conflict} == {"china", "flower"}
    # Report mode keeps every example; each carries its perceptual hashes.
    written = read_examples(examples.uri)
    assert sum(len(v) for v in written.values()) == ORIGINALS + 4 + 10
    assert all(len(e["image/hash/perceptual"]) == 2 * 48 for v in written.values() for e in v)


def test_drop_keeps_one_copy_of_each_group_in_train_and_reports_conflicts(near_tree, tmp_path):
    data, expected = near_tree
    examples, report = run_executor(data, tmp_path, layout="presplit", near_duplicates="drop")
    written = read_examples(examples.uri)
    paths = {e["image/filename"].decode() for v in written.values() for e in v}
    # The eval copies and the PNG copy are dropped (quarantined with a reason); the conflict stays for a person.
    assert sorted(e["image/filename"].decode() for e in written["eval"]) == sorted(
        f"eval/{('china', 'flower')[n % 2]}/photo-{n:03d}.jpg" for n in range(ORIGINALS, ORIGINALS + 4)
    )
    assert "train/flower/photo-011.png" not in paths and "train/flower/photo-011.jpg" in paths
    assert {"train/china/photo-010.jpg", "train/flower/relabelled-010.jpg"} <= paths
    with open(os.path.join(report.uri, QUARANTINE_FILE), newline="") as f:
        dropped = [row for row in csv.DictReader(f) if row["reason"] == "near_duplicate"]
    assert len(dropped) == 9 and all("near-duplicate of train/" in row["detail"] for row in dropped)
    summary = _summary(report)
    assert summary["near_duplicates_dropped"] == 9
    assert summary["files_seen"] == summary["examples_written"] + summary["quarantined"]  # every file accounted for


def test_drop_on_hash_split_data_removes_each_copy_from_the_split_it_was_placed_in(near_tree, tmp_path):
    """The same photos in class folders: the split is by content hash and these small classes wait whole for
    their placement (placement.py: Beam stages), so every copy --near-duplicates drop removes sits in a placed
    shard. The dropped files are gone, each group keeps its first file, the counts are those of the examples
    written, and Beam's multi-process mode (the stages pickled to worker processes) writes the same."""
    import shutil

    source, expected = near_tree
    data = tmp_path / "flat"
    for split in ("train", "eval"):
        for label in ("china", "flower"):
            for name in os.listdir(os.path.join(source, split, label)):
                os.makedirs(data / label, exist_ok=True)
                shutil.copy(os.path.join(source, split, label, name), data / label / f"{split}-{name}")
    runs = {}
    for mode, args in (
        ("in process", None),
        ("worker processes", ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]),
    ):
        examples, report = run_executor(
            str(data), tmp_path / mode.replace(" ", "-"), beam_args=args, near_duplicates="drop"
        )
        written = read_examples(examples.uri)
        where = {e["image/filename"].decode(): split for split, es in written.items() for e in es}
        with open(os.path.join(report.uri, QUARANTINE_FILE), newline="") as f:
            dropped = {row["path"]: row for row in csv.DictReader(f) if row["reason"] == "near_duplicate"}
        groups, _ = _groups(report.uri)
        summary = _summary(report)
        assert len(where) == sum(len(es) for es in written.values())  # nothing twice
        assert len(groups) == 10 and len(dropped) == 9  # the conflicting pair stays, for a person
        assert not set(dropped) & set(where) and len(where) + len(dropped) == summary["files_seen"]
        for group in groups:
            kept = [path for path in group if path in where]
            assert len(kept) == (2 if len(group - set(dropped)) == 2 else 1), group
        for row in dropped.values():  # each row names the split the file was placed in, never "_pending"
            assert row["split"] in ("train", "eval") and "kept there only" in row["detail"]
        per_class = {split: {} for split in written}
        for split, es in written.items():
            for e in es:
                label = e["image/class/text"].decode()
                per_class[split][label] = per_class[split].get(label, 0) + 1
        assert summary["examples_per_split_and_class"] == per_class
        assert summary["examples_written"] == len(where) and summary["near_duplicates_dropped"] == 9
        runs[mode] = (where, dropped)
    assert runs["in process"] == runs["worker processes"]


@pytest.mark.parametrize("data", ["near_tree", "near_tree with twins dropped", "digits_dir"])
def test_the_in_memory_and_the_beam_searches_find_the_same_groups(data, request, tmp_path, monkeypatch):
    """The search in the executor's memory (local runs) and as Beam stages (Dataflow, or past
    grouping.MEMORY_MAX_IMAGES) give the same groups: on the planted copies (also with exact twins of
    copies that --drop-duplicates removes, which may be a group's hub either way), and on the 1,797 digits, whose
    look-alike drawings fill the buckets (the limits come from the same sample of signatures either way)."""
    import shutil

    from images.near_duplicates import grouping

    fixture = request.getfixturevalue(data.split()[0])
    folder, layout = (fixture[0], "presplit") if data.startswith("near_tree") else (fixture, "folders")
    options = {}
    if data == "near_tree with twins dropped":
        folder = shutil.copytree(folder, tmp_path / "twins")
        for n in range(8):  # a twin of each original with a copy in eval, named to sort first in its bucket
            label = ("china", "flower")[n % 2]
            shutil.copy(folder / "train" / label / f"photo-{n:03d}.jpg", folder / "train" / label / f"a-twin-{n}.jpg")
        options = {"drop_duplicates": True}
    found = {}
    # In memory, small buckets' pairs are tested in bulk and large ones as matrix products: both, then all large.
    memory, usual = grouping.MEMORY_MAX_IMAGES, grouping.LARGE_BUCKET
    for run, where, most, large in (
        ("memory", "memory", memory, usual),
        ("beam", "beam", 0, usual),
        ("memory, every bucket large", "memory", memory, 1),
    ):
        monkeypatch.setattr(grouping, "MEMORY_MAX_IMAGES", most)
        monkeypatch.setattr(grouping, "LARGE_BUCKET", large)
        _, report = run_executor(folder, tmp_path / run, layout=layout, **options)
        summary = _summary(report)
        assert summary["near_duplicate_search"]["where"] == where
        figures = {k: v for k, v in summary.items() if k.startswith("near_duplicate_")}
        figures.pop("near_duplicate_search")
        found[run] = (sorted(sorted(g) for g in _groups(report.uri)[0]), figures)
    assert found["memory"] == found["memory, every bucket large"] == found["beam"]
    assert len(found["memory"][0]) >= (3 if data == "digits_dir" else 10)  # groups found, not two empty answers
    if options:  # each eval copy still in a group with what is left of its original (one of the twins)
        assert found["memory"][1]["near_duplicate_eval_leaks"] == 8


def test_every_pair_within_strict_limits_shares_a_bucket_and_every_bucket_pair_is_tested():
    """The bands' promise (similarity.band_bits): with limits of a few bits, limit + 1 disjoint bands, so any two
    pHashes within the limit share a bucket (pigeonhole); and bucket_candidates gives every pair of every bucket,
    in chunks of any size."""
    from images.near_duplicates import similarity

    rng = np.random.default_rng(5)
    rows = rng.integers(0, 256, size=(300, similarity.SIGNATURE_BYTES), dtype=np.uint8)
    copies = rows[:100].copy().reshape(100, len(similarity.SCALES), -1)
    for n in range(100):  # flip up to 3 pHash bits of one scale, moved to another scale
        bits = np.unpackbits(copies[n, 0, :8])
        bits[rng.choice(64, n % 4, replace=False)] ^= 1
        copies[n, 2, :8] = np.packbits(bits)
    rows = np.concatenate([rows, copies.reshape(100, -1)])
    limits = similarity.NearDuplicateLimits(phash_bits=3, dhash_bits=64, colour=255)
    flat, image = similarity.buckets(similarity.band_codes(rows, similarity.band_bits(limits, len(rows))))
    for most in (1, 7, 1 << 18):
        pairs = {(int(a), int(b)) for i, j in similarity.bucket_candidates(flat, image, most) for a, b in zip(i, j)}
        brute = {
            (int(image[x]), int(image[y]))
            for x in range(len(flat))
            for y in range(x + 1, len(flat))
            if flat[x] == flat[y]
        }
        assert pairs == brute
    assert all((n, 300 + n) in pairs for n in range(100))  # every copy shares a bucket with its original
    h = similarity.hashes(rows)
    assert similarity.near(h, np.arange(100), np.arange(300, 400), limits).all()


def test_signatures_hold_imagehash_s_bits():
    """signature.py computes ImageHash's pHash and dHash (and Pillow's box-resized colour grid) as matrix products
    with Pillow's fixed-point weights: the same bits as ImageHash's own calls on photos, drawings, a flat frame and
    a gradient (the grids exactly; a hash bit could differ only where a DCT value lies within floating-point
    rounding of the median: none here, and none on 600 photos with the floating-point weights before)."""
    import imagehash

    from images.near_duplicates import signature, similarity

    def reference(image):  # what signature.py replaced: ImageHash and Pillow, crop by crop
        thumb = image.convert("RGB").resize((similarity.THUMB, similarity.THUMB), Image.BILINEAR)
        out = []
        for scale in similarity.SCALES:
            margin = int(round(similarity.THUMB * (1 - scale) / 2))
            box = (margin, margin, similarity.THUMB - margin, similarity.THUMB - margin)
            for fn in (imagehash.phash, imagehash.dhash):
                out.append(np.packbits(fn(thumb.convert("L").crop(box)).hash.flatten()).tobytes())
            out.append(np.asarray(thumb.crop(box).resize((similarity.GRID, similarity.GRID), Image.BOX)).tobytes())
        return b"".join(out)

    images = [Image.open(io.BytesIO(data)) for data in _photos(40)]
    images += [
        Image.new("RGB", (64, 48), (200, 200, 200)),
        Image.new("L", (90, 70), 30),
        Image.fromarray(np.tile(np.arange(256, dtype=np.uint8), (80, 1))).convert("RGB"),
    ]
    images += [Image.fromarray(((np.indices((32, 32)).sum(0) * k) % 256).astype(np.uint8)) for k in range(3, 13)]
    ours = np.frombuffer(b"".join(signature.signature(i) for i in images), np.uint8).reshape(len(images), 3, -1)
    theirs = np.frombuffer(b"".join(reference(i) for i in images), np.uint8).reshape(len(images), 3, -1)
    bits = np.unpackbits(ours[..., :16], axis=-1) != np.unpackbits(theirs[..., :16], axis=-1)
    assert bits.sum() <= 2, bits.sum()  # of 53 x 3 x 128 bits
    grid_error = np.abs(ours[..., 16:].astype(int) - theirs[..., 16:].astype(int)).max()  # the grids, of 255
    assert grid_error == 0
    # The sums are exact integers, so a signature does not depend on the order BLAS adds in, which changes with
    # the shape of a product: the same alone as in any batch (floating-point weights made grid cells 1 apart).
    thumbnails = [signature.thumbnail(i) for i in images]
    alone = [signature.signatures([t])[0] for t in thumbnails]
    assert alone == [signature.signature(i) for i in images]
    for size in (2, 7, 64):
        assert [s for k in range(0, len(images), size) for s in signature.signatures(thumbnails[k : k + size])] == alone


def test_near_duplicates_off_makes_no_signature_and_says_it_was_not_searched(near_tree, tmp_path):
    data, _ = near_tree
    examples, report = run_executor(data, tmp_path, layout="presplit", near_duplicates="off")
    summary = _summary(report)
    assert summary["near_duplicate_search"] == {"where": "off"}
    assert summary["examples_written"] == ORIGINALS + 4 + 10
    # Unknown, not none found: the model card shows "-" (components/model_card/render.py).
    assert all(summary[key] is None for key in ("near_duplicate_groups", "near_duplicate_eval_leak_fraction"))
    written = read_examples(examples.uri)
    assert not any(e["image/hash/perceptual"] for v in written.values() for e in v)
    assert _groups(report.uri)[0] == []
    # Data health has no share to gate (not 0%, which would read as checked).
    assert checks.problems(None, None, None, checks.Limits(0.0, 1.0, 1.0)) == []


def _summary(report):
    import json

    from components.example_gen import SUMMARY_FILE

    return json.load(open(os.path.join(report.uri, SUMMARY_FILE)))


def test_flipped_labels_rank_near_the_top(digits_dir):
    """5% of the digits' labels flipped: the out-of-sample check (k-fold logistic regression on the images'
    pixels as features) with cleanlab's ranking puts most flips among the first 2x(flips) suspects."""
    labels, vectors = [], []
    for label in range(10):
        folder = os.path.join(digits_dir, str(label))
        for name in sorted(os.listdir(folder)):
            vectors.append(
                np.asarray(Image.open(os.path.join(folder, name)).convert("L").resize((16, 16)), np.float32).ravel()
            )
            labels.append(label)
    labels, vectors = np.asarray(labels), np.stack(vectors)
    rng = np.random.default_rng(0)
    flipped = rng.choice(len(labels), size=len(labels) // 20, replace=False)
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + rng.integers(1, 10, size=len(flipped))) % 10
    folds, why = label_issues.folds_for(noisy)
    assert (folds, why) == (label_issues.FOLDS, "")
    suspects = label_issues.rank(noisy, label_issues.probabilities_from_features(vectors, noisy, folds, seed=0))
    top = {s.index for s in suspects[: 2 * len(flipped)]}
    assert len(top & set(flipped)) >= 0.7 * len(flipped)
    # The suggested label of a flip found is mostly its true one.
    found = [s for s in suspects if s.index in set(flipped)]
    assert np.mean([s.suggested == labels[s.index] for s in found]) > 0.8


def test_the_class_mix_is_warned_about_and_stops_nothing():
    """Above 10:1 in train, and classes with under 10 eval images (a class with none at all, too), are warnings."""
    warned = checks.class_warnings(
        {"train": {"ok": 1600, "defect": 32, "scratch": 40}, "eval": {"ok": 400, "defect": 8, "scratch": 10}}
    )
    assert [w["check"] for w in warned] == ["class imbalance", "few eval images"]
    assert warned[0]["value"] == 50.0 and "imbalanced 50:1 (ok 1,600 (95.7%)" in warned[0]["text"]
    assert warned[1]["classes"] == ["defect"] and "defect (8)" in warned[1]["text"]
    assert checks.class_warnings({"train": {"a": 90, "b": 10}, "eval": {"a": 20, "b": 0}})[0]["classes"] == ["b"]
    assert checks.class_warnings({"train": {"a": 50, "b": 40}, "eval": {"a": 12, "b": 10}}) == []


def test_poor_images_drift_and_thresholds():
    assert checks.poor_image_reasons(128.0, 60.0, 480, 640) == []
    assert "nearly blank" in checks.poor_image_reasons(128.0, 1.0, 480, 640)[0]
    assert "very dark" in checks.poor_image_reasons(10.0, 9.0, 480, 640)[0]
    assert "extreme aspect ratio (4000x300)" in checks.poor_image_reasons(128.0, 60.0, 300, 4000)[0]
    rng = np.random.default_rng(0)
    reference = rng.normal(1.0, 0.5, size=(2000, 64))

    def profile(x):
        return {"mean": x.mean(axis=0).tolist(), "std": x.std(axis=0).tolist()}

    same = checks.feature_drift(profile(reference[:1000]), profile(reference[1000:]))
    darker = checks.feature_drift(profile(reference), profile(reference * 0.6))
    assert same < 0.1 < 0.5 < darker
    assert checks.feature_drift(profile(reference), None) is None
    found = checks.problems(0.05, 0.2, None, checks.Limits(0.01, 0.1, 0.5))
    assert [p["option"] for p in found] == ["--max-eval-near-duplicates", "--max-label-issues"]
    assert "\n" not in checks.describe(found) and "5.0% of the eval examples" in checks.describe(found)
    assert checks.problems(0.05, None, 0.2, checks.Limits(1.0, 1.0, 0.5)) == []
    # Far from every class: three tight classes, two images far off (one in eval: judged by train's centres).
    centres = rng.normal(0, 10, size=(3, 16))
    z = np.concatenate([centres[n % 3] + rng.normal(0, 1, size=16) for n in range(300)]).reshape(300, 16)
    z[7] += 40
    z[250] -= 40
    labels = np.arange(300) % 3
    train = np.arange(300) < 240
    far, _ = checks.far_from_every_class(z.astype(np.float32), labels, train)
    assert sorted(np.nonzero(far)[0].tolist()) == [7, 250]


@pytest.mark.slow
def test_the_label_check_stops_the_run_and_the_report_shows_the_suspects(label_flip_runs):
    """The shared runs (tests/conftest.py label_flip_runs): the first stopped by --max-label-issues, the second
    warned."""
    from browser import open_page
    from test_report import ARTIFACTS, CHECK_JS

    moved, stopped, warned = (label_flip_runs[k] for k in ("moved", "stopped", "warned"))
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    error = stopped.stderr.strip().splitlines()[-1]
    assert error.startswith("imagepipe: error: DataHealthError: data health found ") and "--max-label-issues" in error
    assert "DataHealthGate" in stopped.stdout and "stopped the run" in stopped.stdout
    listed = stopped.stdout.split("likely label errors, most likely first: ")[1].splitlines()[0]
    with open(listed, newline="") as f:
        suspects = list(csv.DictReader(f))
    truth = dict(moved)
    top = [row for row in suspects[: 2 * len(moved)] if row["path"] in truth]
    assert len(top) >= len(moved) // 2  # a 3-epoch cnn per fold, 240 training images: most flips near the top
    assert sum(row["suggested"] == truth[row["path"]] for row in top) >= 0.8 * len(top)  # and their true label
    report = stopped.stdout.strip().splitlines()[-1].removeprefix("report: ")
    seen = open_page("file://" + report, CHECK_JS, os.path.join(ARTIFACTS, "report-data-health.png"))
    assert seen["errors"] == [] and "health" in seen["check"]["sections"]
    assert seen["check"]["images"] and all(seen["check"]["images"])  # the suspects' thumbnails load
    text = seen["check"]["text"]
    assert "its model's out-of-sample accuracy 0." in stopped.stdout and "too low" not in stopped.stdout
    for expected in (
        "The data health check stopped the run",
        "Likely label errors",
        f"{len(suspects)} of 300 examples",
        "3-fold cnn on pixels",
        "Outliers and poor images",
        "Drift in feature space",
        "--max-label-issues",
        "the data health check stopped the run",
    ):
        assert expected in text, expected
    # --gate warn: the same findings (DataHealth cached), and the run goes on to a model.
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert "DataHealthGate                cached" not in warned.stdout
    assert "over the limits (warn only)" in warned.stdout and "Pusher" in warned.stdout


def test_a_bucket_of_look_alike_images_sends_a_spanning_set_of_pairs():
    """200 blank frames hash alike: one group of 200 from at most 199 pairs, not 19,900."""
    from components.example_gen.writing.batch_ingest import Meta
    from images.near_duplicates import grouping, signature, similarity

    blank = signature.signature(Image.new("RGB", (64, 48), (200, 200, 200))).hex()
    metas = [
        Meta(f"{n:064x}", f"blank/{n:03d}.png", "blank", "train", False, "png", "s", n, False, blank)
        for n in range(200)
    ]
    buckets = dict(grouping.band_items(metas[:120], similarity.NearDuplicateLimits(), 200))
    key = next(iter(buckets))
    assert len(buckets[key]) == 120  # every blank frame in every bucket
    more = dict(grouping.band_items(metas[120:], similarity.NearDuplicateLimits(), 200))
    pairs = list(grouping.bucket_pairs((key, [buckets[key], more[key]]), similarity.NearDuplicateLimits()))
    assert len(pairs) == 199
    groups = grouping.group([(Meta(*a), Meta(*b)) for a, b in pairs])
    assert [len(g) for g in groups] == [200]


def test_a_removed_copy_at_a_group_s_hub_leaves_the_rest_of_the_group():
    """The searches send a spanning set of pairs (a star around one image in memory, a forest per bucket in Beam):
    when an exact duplicate removed at ingestion is the hub, the other copies still form their group (they were
    dropped with it, and the eval copy's leak went uncounted)."""
    from components.example_gen.writing.batch_ingest import Meta
    from images.near_duplicates import grouping

    def meta(path, split="train"):
        return Meta(path.ljust(64, "0"), path, "cat", split, False, "jpeg", "s", 0, False, "")

    hub, twin, resized, recompressed = meta("r2.png"), meta("r1.png"), meta("b.jpg"), meta("c.jpg", "eval")
    star = [(hub, twin), (hub, resized), (hub, recompressed)]
    groups = grouping.group(star, removed=["r2.png"])
    assert [[m.rel_path for m in g] for g in groups] == [["b.jpg", "r1.png", "c.jpg"]]  # train first, then eval
    assert grouping.group([(hub, twin)], removed=["r2.png"]) == []  # one image left: no group


def test_exact_copies_are_searched_once_and_grouped_in_linear_time():
    """A manifest naming two files 5,000 times made buckets of thousands of copies, every pair of them tested
    (ImageExampleGen: 72 s at 5,000 rows, 20,000 not done in 350 s). Copies are searched once, then join their
    image's group: 10,000 copies of a blank frame and its one look-alike are one group (a spanning set of 10,000
    pairs, not 50 million), 5,000 copies of an image with no look-alike are none; both searches agree. Rows of a
    label conflict name a few of the other copies, not all of them."""
    from components.example_gen.writing.batch_ingest import Meta
    from components.example_gen.writing.beam_steps import Resolve
    from images.near_duplicates import grouping, signature, similarity

    blank = signature.signature(Image.new("RGB", (64, 48), (200, 200, 200)))
    look_alike = signature.signature(Image.new("RGB", (64, 48), (203, 200, 200)))
    noise = signature.signature(Image.fromarray(np.random.default_rng(1).integers(0, 256, (48, 64, 3), np.uint8)))
    signatures = [blank] * 10_000 + [look_alike] + [noise] * 5_000
    contents = [b"a" * 32] * 10_000 + [b"b" * 32] + [b"c" * 32] * 5_000
    rows = np.frombuffer(b"".join(signatures), np.uint8).reshape(len(signatures), -1)
    content = np.array(contents, dtype="S32")
    pairs = grouping.search(rows, content, similarity.NearDuplicateLimits(), len(rows))
    assert len(pairs) == 10_000 and {k for pair in pairs for k in pair} == set(range(10_001))

    metas = [
        Meta(c.hex(), f"img/{n:05d}.png", "x", "train", False, "png", "s", n, False, s.hex())
        for n, (c, s) in enumerate(zip(contents, signatures))
    ][::5]  # 2,000 + 1 + 1,000: Beam's way
    key, items = next(iter(grouping.band_items(metas, similarity.NearDuplicateLimits(), len(metas))))
    found = list(grouping.bucket_pairs((key, [items]), similarity.NearDuplicateLimits()))
    groups = grouping.group([(Meta(*a, ""), Meta(*b, "")) for a, b in found])
    assert [len(g) for g in groups] == [2_001]

    conflict = [
        Meta("d" * 64, f"rows/{n:05d}.png", ("cat", "dog")[n % 2], "train", False, "png", "s", 1, False, "")
        for n in range(5_000)
    ]
    rejected = [
        row
        for kind, (meta, row) in (
            (k, v) for k, v in Resolve(drop_duplicates=False).process(("d", conflict)) if k == "rejected"
        )
    ]
    assert len(rejected) == 5_000 and max(len(row["detail"]) for row in rejected) < 200
    assert rejected[0]["detail"].endswith("and 4,996 more")


def test_the_label_check_holds_a_bounded_sample_stratified_by_class():
    """Above LABEL_CHECK_SAMPLE images the label check holds a sample: every class in proportion, a small class
    at least MIN_SAMPLED_PER_CLASS (or all of it), chosen by content hash (the same images each run); the share
    of suspects is estimated class by class. At or below the bound every image is checked, as before."""
    import hashlib

    from components.health import executor as health

    counts = {0: 900_000, 1: 99_000, 2: 1_000, 3: 30}
    sample = health.Sample(counts, multi_label=False)
    keys = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(200_000)]
    kept = {c: sum(sample.keeps(k, c) for k in keys) for c in counts}  # each class's share, on 200,000 keys
    expected = {
        c: min(1.0, max(health.MIN_SAMPLED_PER_CLASS, health.LABEL_CHECK_SAMPLE * n / sum(counts.values())) / n)
        * len(keys)
        for c, n in counts.items()
    }
    for c in counts:
        assert kept[c] == pytest.approx(expected[c], rel=0.05, abs=30), (c, kept[c], expected[c])
    assert [sample.keeps(k, 0) for k in keys[:1000]] == [sample.keeps(k, 0) for k in keys[:1000]]  # the same
    # Train and eval alike: the split takes a class's lowest content-hash positions for train (stratify.position),
    # and a sample by those would hold train only; the sample's share is the same among eval's positions.
    from components.example_gen.splitting.stratify import position

    evals = [k for k in keys if position(k) >= 0.8]
    assert sum(sample.keeps(k, 0) for k in evals) == pytest.approx(expected[0] / len(keys) * len(evals), rel=0.1)
    assert all(health.Sample({0: 10_000, 1: 10_000}, False).keeps(k, 0) for k in keys[:100])  # at the bound: all
    # The estimate weighs each class's suspects by its images: 2 of 10 sampled in a class of 100 -> 20.
    examples = health.Examples(
        keys=[f"k{n}" for n in list(range(10)) + list(range(100, 120))],
        labels=[0] * 10 + [1] * 20,
        per_class={0: 100, 1: 20},
    )  # 10 of 100, 20 of 20
    rows = [{"key": "k0"}, {"key": "k1"}, {"key": "k100"}]
    assert health._issue_fraction(examples, rows, multi_label=False) == pytest.approx((20 + 1) / 120, abs=1e-6)


def _health_inputs(folder, rng, image_size=8):
    """Transform-like examples (gzip) and features-step records for 300 images of three classes: two poor
    images (one blank, one dark), two far from every class in feature space (one in eval), copies of one image in
    train; with the reference findings of checks.py's in-memory functions on the same numbers."""
    import hashlib

    import tensorflow as tf

    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        if isinstance(value, np.ndarray):
            return tf.train.Feature(float_list=tf.train.FloatList(value=value.tolist()))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    n, dim = 300, 16
    centres = rng.normal(0, 10, size=(3, dim))
    labels = np.arange(n) % 3
    vectors = np.stack([centres[c] + rng.normal(0, 1, size=dim) for c in labels]).astype(np.float32)
    vectors[7] += 40
    vectors[250] -= 40
    pixels = rng.integers(40, 220, size=(n, image_size, image_size, 3)).astype(np.uint8)
    pixels[11] = 128  # blank
    pixels[260] = 5  # dark
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    keys[21], pixels[21], vectors[21] = keys[20], pixels[20], vectors[20]  # a copy: one key, two examples
    splits = ["train" if i < 240 else "eval" for i in range(n)]
    for split in ("train", "eval"):
        os.makedirs(folder / "examples" / f"Split-{split}")
        os.makedirs(folder / "features" / f"Split-{split}")
        rows = [i for i in range(n) if splits[i] == split]
        with tf.io.TFRecordWriter(str(folder / "examples" / f"Split-{split}" / "part.gz"), "GZIP") as out:
            for i in rows:
                out.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "pixels": feature(tf.io.serialize_tensor(pixels[i]).numpy()),
                                "label": feature(int(labels[i])),
                                "key": feature(keys[i].encode()),
                                "filename": feature(f"{labels[i]}/{i:03d}.png".encode()),
                                "original_height": feature(64),
                                "original_width": feature(64),
                            }
                        )
                    ).SerializeToString()
                )
        with tf.io.TFRecordWriter(str(folder / "features" / f"Split-{split}" / "part.tfrecord")) as out:
            for i in rows:
                out.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "features": feature(vectors[i]),
                                "label": feature(int(labels[i])),
                                "key": feature(keys[i].encode()),
                            }
                        )
                    ).SerializeToString()
                )
    train = np.asarray(splits) == "train"
    mean, scale = vectors.astype(np.float64).mean(axis=0), vectors.astype(np.float64).std(axis=0) + 1e-6
    far, _ = checks.far_from_every_class(((vectors - mean) / scale).astype(np.float32), labels, train)
    gray = pixels.astype(np.float32).mean(axis=-1)
    expected = {}
    for i in range(n):
        reasons = checks.poor_image_reasons(float(gray[i].mean()), float(gray[i].std()), 64, 64)
        reasons += ["far from every class (feature space)"] if far[i] else []
        if reasons:
            expected[f"{labels[i]}/{i:03d}.png"] = "; ".join(reasons)
    return keys, labels, expected


@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_data_health_s_passes_run_as_beam_and_find_what_the_in_memory_checks_find(tmp_path, mode):
    """DataHealth's graph (passes.py) on Beam's local runner, in one process and in two worker processes (as
    Dataflow would run it, pickled): the poor and far images that checks.py's in-memory functions find on the same
    numbers, a class count per class, every image of the label check's sample with its vector (copies: one)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.health import passes
    from components.health.sample import Sample
    from trainer.hparams import HParams

    keys, labels, expected = _health_inputs(tmp_path, np.random.default_rng(5))
    assert {"2/011.png", "2/260.png", "1/007.png", "1/250.png"} <= set(expected)  # the planted ones, and so on
    examples = {s: str(tmp_path / "examples" / f"Split-{s}" / "*") for s in ("train", "eval")}
    features = {
        "dim": 16,
        "views": {},
        "files": {s: str(tmp_path / "features" / f"Split-{s}" / "*") for s in ("train", "eval")},
    }
    hp = HParams(model="cnn", image_size=8)
    options = PipelineOptions(["--direct_running_mode=" + mode, "--direct_num_workers=2"])
    with beam.Pipeline(options=options) as pipeline:
        gathering = passes.Gathering(hp, ["0", "1", "2"], Sample({0: 100, 1: 100, 2: 100}, False), False, False)
        passes.build(pipeline, examples, features, gathering, out_dir=str(tmp_path / "out"))
    found = passes.read(str(tmp_path / "out"))
    assert {row["path"]: row["reasons"] for row in found["rows"]} == expected
    assert all(row["label"] == row["path"].split("/")[0] for row in found["rows"])
    assert found["counts"] == {0: 100, 1: 100, 2: 100}
    assert len(found["sample"]) == 300 and set(found["vectors"]) == set(keys)
    assert sorted(r[3] for r in found["sample"]) == sorted(labels.tolist())


def test_data_health_s_passes_gather_the_same_sample_from_examples_and_features_and_run_without_features(tmp_path):
    """Above the bound the examples' pass and the features' pass keep the same images (the label check joins them
    by key); without features (the cnn's runs) only the poor images are found, and the sample carries pixels."""
    import apache_beam as beam

    from components.health import passes
    from components.health.sample import Sample
    from trainer.hparams import HParams

    keys, labels, expected = _health_inputs(tmp_path, np.random.default_rng(5))
    examples = {s: str(tmp_path / "examples" / f"Split-{s}" / "*") for s in ("train", "eval")}
    features = {
        "dim": 16,
        "views": {},
        "files": {s: str(tmp_path / "features" / f"Split-{s}" / "*") for s in ("train", "eval")},
    }
    sample = Sample({0: 100, 1: 100, 2: 100}, False, most=60)
    chosen = {k for k, c in zip(keys, labels) if sample.keeps(k, int(c))}
    assert 100 < len(chosen) < 200  # MIN_SAMPLED_PER_CLASS (50) of each class of 100, by hash
    hp = HParams(model="cnn", image_size=8)
    for name, given, pixels in (("with", features, False), ("without", None, True)):
        with beam.Pipeline() as pipeline:
            gathering = passes.Gathering(hp, ["0", "1", "2"], sample, keep_pixels=pixels, multi_label=False)
            passes.build(pipeline, examples, given, gathering, out_dir=str(tmp_path / name))
        found = passes.read(str(tmp_path / name))
        assert {r[0] for r in found["sample"]} == chosen
        if given is not None:
            assert set(found["vectors"]) == chosen
        else:
            assert found["vectors"] == {} and all(r[4].shape == (8, 8, 3) for r in found["sample"])
            poor = {path: why for path, why in expected.items() if "feature space" not in why}
            assert {row["path"]: row["reasons"] for row in found["rows"]} == poor
