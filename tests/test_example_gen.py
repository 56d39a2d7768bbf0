"""ImageExampleGen's executor on real files with real Beam; output read back with TensorFlow."""

import itertools
import os

import pytest
import tensorflow as tf
from conftest import image_bytes, make_class_tree, write
from example_gen_helpers import by_filename, quarantine, read_examples, run_executor, summary

from components.example_gen.ingest_report import IngestionError
from images.image_check import Reason

GOOD_EXTRA = {
    # path -> (label, format): valid images with odd names, formats and modes
    "cat/renamed-png.jpg": ("cat", "png"),
    "cat/UPPER.JPEG": ("cat", "jpeg"),
    "cat/noext": ("cat", "jpeg"),
    "cat/2021/summer/nested.png": ("cat", "png"),
    "chat é/mon image.jpg": ("chat é", "jpeg"),
    "dog/cmyk.jpg": ("dog", "jpeg"),
    "dog/gray.jpg": ("dog", "jpeg"),
    "dog/pic.gif": ("dog", "gif"),
    "dog/pic.bmp": ("dog", "bmp"),
    "dog/dup-a.jpg": ("dog", "jpeg"),
    "dog/dup-b.jpg": ("dog", "jpeg"),
}
BAD = {
    "cat/empty.jpg": Reason.EMPTY,
    "cat/truncated.jpg": Reason.TRUNCATED,
    "dog/notes.jpg": Reason.NOT_AN_IMAGE,
    "dog/scan.tif": Reason.UNSUPPORTED,
    "dog/photo.webp": Reason.UNSUPPORTED,
    "dog/1bit.bmp": Reason.UNSUPPORTED,
    "cat/badcrc.png": Reason.CORRUPT,
    "cat/huge.png": Reason.TOO_MANY_PIXELS,
    "cat/pipe.jpg": Reason.UNREADABLE,
    "dog/broken-link.jpg": Reason.UNREADABLE,
    "README.txt": Reason.MISSING_LABEL,
    "cat/same.jpg": Reason.LABEL_CONFLICT,
    "dog/same.jpg": Reason.LABEL_CONFLICT,
}
MAX_PIXELS = 100_000


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """Two classes of good images plus one of every kind of bad file."""
    root = tmp_path_factory.mktemp("messy")
    good = make_class_tree(root, per_class=15)
    write(root / "cat/renamed-png.jpg", image_bytes("PNG", seed=501))
    write(root / "cat/UPPER.JPEG", image_bytes(seed=502))
    write(root / "cat/noext", image_bytes(seed=503))
    write(root / "cat/2021/summer/nested.png", image_bytes("PNG", seed=504))
    write(root / "chat é/mon image.jpg", image_bytes(seed=505))
    write(root / "dog/cmyk.jpg", image_bytes(mode="CMYK", seed=506))
    write(root / "dog/gray.jpg", image_bytes(mode="L", seed=507))
    write(root / "dog/pic.gif", image_bytes("GIF", seed=508))
    write(root / "dog/pic.bmp", image_bytes("BMP", seed=509))
    write(root / "dog/dup-a.jpg", image_bytes(seed=510))
    write(root / "dog/dup-b.jpg", image_bytes(seed=510))
    jpeg = image_bytes(size=(64, 48), seed=511)
    write(root / "cat/empty.jpg", b"")
    write(root / "cat/truncated.jpg", jpeg[: len(jpeg) // 2])
    write(root / "dog/notes.jpg", b"not an image\n")
    write(root / "dog/scan.tif", image_bytes("TIFF", seed=512))
    write(root / "dog/photo.webp", image_bytes("WEBP", seed=513))
    write(root / "dog/1bit.bmp", image_bytes("BMP", mode="1", seed=514))
    png = bytearray(image_bytes("PNG", seed=515))
    png[29] ^= 0xFF  # IHDR CRC
    write(root / "cat/badcrc.png", bytes(png))
    write(root / "cat/huge.png", image_bytes("PNG", size=(400, 300), seed=516))
    os.mkfifo(root / "cat/pipe.jpg")
    os.symlink(root / "nowhere.jpg", root / "dog/broken-link.jpg")
    write(root / "README.txt", b"about the data")
    write(root / "cat/same.jpg", image_bytes(seed=517))
    write(root / "dog/same.jpg", image_bytes(seed=517))
    write(root / ".DS_Store", b"\0\0")
    expected = {**{p: (label, "jpeg") for p, label in good.items()}, **GOOD_EXTRA}
    return str(root), expected


@pytest.fixture(scope="module")
def messy_run(messy, tmp_path_factory):
    root, expected = messy
    out = tmp_path_factory.mktemp("out")
    # Worker processes, as a large input gets them (a small one is ingested inline: see below).
    examples, report = run_executor(
        root, out, beam_args=["--direct_num_workers=2"], max_pixels=MAX_PIXELS, max_bad_fraction=1.0
    )
    return examples, report, expected


def test_every_file_is_accounted_for(messy_run):
    examples, report, expected = messy_run
    s = summary(report.uri)
    assert s["files_seen"] == len(expected) + len(BAD) == s["examples_written"] + s["quarantined"]
    assert s["skipped_hidden"] == 1
    assert report.get_int_custom_property("quarantined") == len(BAD)


def test_good_files_become_examples_with_original_bytes(messy, messy_run):
    root, _ = messy
    examples, _, expected = messy_run
    got = by_filename(read_examples(examples.uri))
    assert set(got) == set(expected)
    label_map = summary(messy_run[1].uri)["label_map"]
    assert label_map == {"cat": 0, "chat é": 1, "dog": 2}  # sorted class names
    for path, (label, fmt) in expected.items():
        e = got[path]
        with open(os.path.join(root, path), "rb") as f:
            assert e["image/encoded"] == f.read()  # never re-encoded
        assert e["image/format"].decode() == fmt
        assert e["image/class/text"].decode() == label
        assert e["image/class/label"] == label_map[label]
        decoded = tf.io.decode_image(e["image/encoded"], expand_animations=False)
        assert tuple(decoded.shape) == (e["image/height"], e["image/width"], e["image/channels"])


def test_bad_files_are_quarantined_with_reasons(messy_run):
    _, report, _ = messy_run
    rows = quarantine(report.uri)
    assert {path: row["reason"] for path, row in rows.items()} == BAD
    assert "same content as dog/same.jpg (dog)" in rows["cat/same.jpg"]["detail"]
    assert "400x300" in rows["cat/huge.png"]["detail"]
    assert summary(report.uri)["quarantine_reasons"][Reason.UNSUPPORTED] == 3


def test_split_is_by_content_hash_about_80_20(messy_run):
    examples, report, _ = messy_run
    got = by_filename(read_examples(examples.uri))
    assert got["dog/dup-a.jpg"]["split"] == got["dog/dup-b.jpg"]["split"]  # duplicates never straddle
    s = summary(report.uri)
    assert s["duplicate_groups"] == 2  # dup-a/dup-b (kept) and same.jpg (conflict)
    assert set(s["examples_per_split"]) == {"train", "eval"}
    assert 0.5 < s["examples_per_split"]["train"] / s["examples_written"] < 0.95


def test_runs_are_deterministic(messy, messy_run, tmp_path):
    root, _ = messy
    examples, report = run_executor(root, tmp_path, max_pixels=MAX_PIXELS, max_bad_fraction=1.0)
    first = by_filename(read_examples(messy_run[0].uri))
    second = by_filename(read_examples(examples.uri))
    assert first == second
    assert quarantine(report.uri) == quarantine(messy_run[1].uri)


def test_examples_leave_ingestion_in_a_seeded_order_that_mixes_the_classes(tmp_path):
    """Class folders are listed one after another; the examples must not come out that way (the Trainer
    would then see one class at a time), and the same seed must give the same order."""
    data = tmp_path / "data"
    classes = [f"class{k}" for k in range(4)]
    make_class_tree(data, classes=classes, per_class=40)

    def order(seed, out):
        examples, _ = run_executor(data, tmp_path / out, seed=seed)
        return [e["image/filename"].decode() for e in read_examples(examples.uri)["train"]]

    first = order(1, "a")
    labels = [path.split("/")[0] for path in first]
    assert set(labels[: len(labels) // 4]) == set(classes)  # every class in the first quarter of the split
    longest = max(len(list(run)) for _, run in itertools.groupby(labels))
    assert longest < 10, labels  # no long stretch of one class (folder order: runs of 30)
    assert order(1, "b") == first  # same seed, same order
    other = order(2, "c")
    assert other != first and sorted(other) == sorted(first)


def test_presplit_folders_keep_their_split_and_a_leak_is_quarantined(tmp_path):
    data = tmp_path / "data"
    make_class_tree(data / "train", per_class=6, seed=1)
    make_class_tree(data / "eval", per_class=3, seed=2)
    write(data / "test" / "cat" / "t.jpg", image_bytes(seed=3))
    write(data / "eval" / "dog" / "leak.jpg", open(data / "train" / "dog" / "img-0.jpeg", "rb").read())
    examples, report = run_executor(data, tmp_path / "out")
    got = read_examples(examples.uri)
    assert {s: len(es) for s, es in got.items()} == {"train": 12, "eval": 6, "test": 1}
    rows = quarantine(report.uri)
    assert rows["eval/dog/leak.jpg"]["reason"] == Reason.DUPLICATE_ACROSS_SPLITS
    assert "train/dog/img-0.jpeg" in rows["eval/dog/leak.jpg"]["detail"]
    assert examples.split_names == '["train", "eval", "test"]'


def test_manifest_with_split_column(tmp_path):
    data = tmp_path / "data"
    made = make_class_tree(data / "images", per_class=10)
    lines = ["path,label,split"]
    for n, (rel, label) in enumerate(sorted(made.items())):
        lines.append(f"images/{rel},{label},{'eval' if n % 4 == 0 else ('train' if n % 4 == 1 else '')}")
    lines += ["../elsewhere.jpg,cat,train", "images/cat/gone.jpg,cat,train", "images/cat/img-1.jpeg,,train"]
    write(data / "manifest.csv", "\n".join(lines).encode())
    examples, report = run_executor(data, tmp_path / "out", input_config=_single("manifest.csv"), max_bad_fraction=0.2)
    got = by_filename(read_examples(examples.uri))
    assert len(got) == 20
    for n, rel in enumerate(sorted(made)):
        if n % 4 in (0, 1):
            assert got[f"images/{rel}"]["split"] == ("eval" if n % 4 == 0 else "train")
    reasons = {p: r["reason"] for p, r in quarantine(report.uri).items()}
    assert reasons == {
        "../elsewhere.jpg": Reason.OUTSIDE_ROOT,
        "images/cat/gone.jpg": Reason.MISSING_FILE,
        "images/cat/img-1.jpeg": Reason.MISSING_LABEL,
    }


def test_drop_duplicates(tmp_path):
    data = tmp_path / "data"
    make_class_tree(data, per_class=5)
    write(data / "cat" / "copy.jpg", open(data / "cat" / "img-0.jpeg", "rb").read())
    for n in range(4):  # 5 of 15 files are dropped copies: over a 10% bad-file limit, if they counted
        write(data / "dog" / f"copy-{n}.jpg", open(data / "dog" / "img-1.jpeg", "rb").read())
    examples, report = run_executor(data, tmp_path / "out", drop_duplicates=True, max_bad_fraction=0.1)
    assert quarantine(report.uri)["cat/img-0.jpeg"]["reason"] == Reason.DUPLICATE  # copy.jpg sorts first
    assert len(by_filename(read_examples(examples.uri))) == 10
    assert summary(report.uri)["bad_fraction"] == 0  # dropped on request, not bad files


def test_too_many_bad_files_fail_the_run_with_counts(tmp_path):
    data = tmp_path / "data"
    make_class_tree(data, per_class=4)
    for n in range(2):
        write(data / "cat" / f"bad-{n}.jpg", b"garbage")
    with pytest.raises(IngestionError) as caught:
        run_executor(data, tmp_path / "out", max_bad_fraction=0.1)
    message = str(caught.value)
    assert "2 of 10 files (20.0%)" in message and "not_an_image 2" in message and "--max-bad-fraction" in message


def test_no_valid_image_fails_clearly(tmp_path):
    for label in ("cat", "dog"):
        write(tmp_path / "data" / label / "x.jpg", b"")
    with pytest.raises(IngestionError, match="no valid image among 2 files"):
        run_executor(tmp_path / "data", tmp_path / "out", max_bad_fraction=1.0)


def test_an_empty_split_fails_clearly(tmp_path):
    make_class_tree(tmp_path / "data" / "train", per_class=3)
    make_class_tree(tmp_path / "data" / "eval", per_class=1, seed=1)
    for label in ("cat", "dog"):  # every eval image is bad
        write(tmp_path / "data" / "eval" / label / "img-0.jpeg", b"broken")
    with pytest.raises(IngestionError, match="split 'eval' has no valid examples"):
        run_executor(tmp_path / "data", tmp_path / "out", max_bad_fraction=1.0)


def test_worker_processes_only_for_inputs_worth_them():
    from components.example_gen import executor
    from images.finding.listing import Candidate

    def files(n, size):
        return [Candidate(f"/d/{i}.jpg", f"{i}.jpg", "cat", None, size) for i in range(n)]

    cores = executor.cpu_count()
    assert executor.local_processes([], files(300, 900)) == 1  # 270 KB of digits: inline
    assert executor.local_processes([], files(executor.INLINE_MAX_FILES, 900)) == cores
    assert executor.local_processes([], files(10, 3 << 20)) == cores  # ten 3 MB photos
    assert executor.local_processes([], files(10, -1)) == cores  # sizes unknown: assume they are worth it
    assert executor.local_processes(["--direct_num_workers=3"], files(10, 900)) == 3  # asked for
    assert executor.local_processes(["--direct_num_workers=0"], files(10, 900)) == cores  # 0: one per core
    for others in (["--direct_running_mode=multi_processing"], ["--runner=DataflowRunner"]):
        assert executor.local_processes(others, files(5000, 3 << 20)) == 1  # Beam's workers ingest inline


def test_ingestion_signs_on_one_blas_thread_and_gives_the_process_its_threads_back(tmp_path, monkeypatch):
    """Each ingestion process has its core (a worker per core, or Beam's): a batch runs numpy's matrix products (the
    near-duplicate signatures) on one BLAS thread, where OpenBLAS would start a thread per core in every process, and
    the process's own setting is back afterwards (the executor's process runs the DAG's other stages)."""
    from PIL import Image
    from threadpoolctl import threadpool_info

    from components.example_gen.ingest_defaults import Ingestion
    from components.example_gen.writing import batch_ingest
    from images.finding.listing import Candidate
    from images.near_duplicates import signature

    def blas_threads():
        return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

    seen, sign = [], signature.signatures

    def spied(thumbnails):  # the real signatures, and the BLAS threads they ran on
        seen.append(blas_threads())
        return sign(thumbnails)

    monkeypatch.setattr(signature, "signatures", spied)
    before = blas_threads()
    candidates = []
    for n in range(3):
        path = tmp_path / "a" / f"{n}.jpg"
        path.parent.mkdir(exist_ok=True)
        Image.new("RGB", (80, 60), (40 * n, 90, 200)).save(path)
        candidates.append(Candidate(str(path), f"a/{n}.jpg", "a", None, path.stat().st_size))
    staging = tmp_path / "staging"
    staging.mkdir()
    settings = batch_ingest.Settings(Ingestion(), str(staging), {"a": 0}, ["train"])
    result = batch_ingest.ingest_batch(candidates, settings)
    assert len(result.metas) == 3 and all(m.signature for m in result.metas)
    assert seen == [[batch_ingest.BLAS_THREADS]] * 3
    assert blas_threads() == before


def test_parallel_and_inline_ingestion_write_the_same_examples(messy, messy_run, tmp_path):
    root, _ = messy
    # Beam's multi_processing mode: the DoFn ingests inline (no worker pool of its own).
    examples, _ = run_executor(
        root,
        tmp_path,
        beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        max_pixels=MAX_PIXELS,
        max_bad_fraction=1.0,
    )
    assert by_filename(read_examples(examples.uri)) == by_filename(read_examples(messy_run[0].uri))


def _single(pattern):
    from tfx.proto import example_gen_pb2

    return example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern)])


def test_shards_rotate_by_size(tmp_path):
    data = tmp_path / "data"
    for label in ("cat", "dog"):
        for n in range(8):
            write(data / label / f"{n}.bmp", image_bytes("BMP", size=(400, 300), seed=n + 100 * (label == "dog")))
    examples, _ = run_executor(data, tmp_path / "out", shard_megabytes=1, max_pixels=10**9)
    train = sorted(os.listdir(os.path.join(examples.uri, "Split-train")))
    assert len(train) > 1
    assert all(name.startswith("data_tfrecord-") and name.endswith(f"-of-{len(train):05d}.gz") for name in train)
    assert sum(len(es) for es in read_examples(examples.uri).values()) == 16


def test_a_class_without_training_examples_fails_clearly(tmp_path):
    data = tmp_path / "data"
    make_class_tree(data / "train", per_class=4)
    make_class_tree(data / "eval", classes=("cat", "dog", "bird"), per_class=2, seed=1)
    with pytest.raises(IngestionError, match="classes with no training example: bird"):
        run_executor(data, tmp_path / "out")


def test_a_file_too_big_to_be_an_image_in_budget_is_not_read(tmp_path):
    data = tmp_path / "data"
    make_class_tree(data, per_class=12)  # enough that the 80/20 hash split gives eval some
    with open(data / "cat" / "video.jpg", "wb") as f:
        f.truncate(3 * 2**20)  # 3 MB of zeros
    _, report = run_executor(data, tmp_path / "out", max_pixels=100_000, max_bad_fraction=0.5)
    row = quarantine(report.uri)["cat/video.jpg"]
    assert row["reason"] == Reason.FILE_TOO_LARGE and "3,145,728 bytes" in row["detail"]


def test_spans_resolve_in_the_executor_when_no_driver_did(tmp_path):
    # Kubeflow Pipelines' open-source backend runs no pre-cache driver: the executor resolves {SPAN}.
    data = tmp_path / "drops"
    make_class_tree(data / "span-1", per_class=3, seed=1)
    make_class_tree(data / "span-2", per_class=4, seed=2)
    examples, report = run_executor(data, tmp_path / "out", input_config=_single("span-{SPAN}"))
    assert summary(report.uri)["files_seen"] == 8
    assert all(f.startswith("span-2/") for f in by_filename(read_examples(examples.uri)))


def test_span_window_reads_the_latest_spans_with_a_folder_pattern(tmp_path):
    from tfx.utils import proto_utils

    from components.example_gen.ingest_settings import IngestSettings

    data = tmp_path / "drops"
    for span in (1, 2, 3, 5):
        make_class_tree(data / f"span-{span}", per_class=1, seed=span)
    props = {
        "input_base": str(data),
        "input_config": proto_utils.proto_to_json(_single("span-5/*")),
        "output_config": "{}",
        "span": 5,
        "span_window": 3,
        "span_pattern": "span-{SPAN}/*",
    }
    settings = IngestSettings.from_exec_properties(props)
    assert settings.window_spans() == [2, 3, 5]
    listing = settings.list_inputs()
    assert sorted({c.rel_path.split("/")[0] for c in listing.candidates}) == ["span-2", "span-3", "span-5"]


def test_zero_padded_spans_in_a_window(tmp_path):
    data = tmp_path / "drops"
    for span in (1, 2, 3):
        make_class_tree(data / f"span-{span:02d}", per_class=4 + span, seed=span)
    examples, report = run_executor(data, tmp_path / "out", input_config=_single("span-{SPAN:2}"), span_window=2)
    files = by_filename(read_examples(examples.uri))
    assert summary(report.uri)["files_seen"] == 2 * 6 + 2 * 7  # spans 02 and 03, not 01
    assert {f.split("/")[0] for f in files} == {"span-02", "span-03"}


def test_a_span_window_over_manifests(tmp_path):
    data = tmp_path / "data"
    made = make_class_tree(data / "images", per_class=12)
    by_class = {label: sorted(p for p in made if made[p] == label) for label in ("cat", "dog")}
    drops = {span: [p for label in by_class for p in by_class[label][(span - 1) * 4 : span * 4]] for span in (1, 2, 3)}
    for span, paths in drops.items():  # each drop's manifest names its own 4 cats and 4 dogs
        write(
            data / f"labels-{span}.csv", ("path,label\n" + "".join(f"images/{p},{made[p]}\n" for p in paths)).encode()
        )
    examples, report = run_executor(data, tmp_path / "out", input_config=_single("labels-{SPAN}.csv"), span_window=2)
    assert sorted(by_filename(read_examples(examples.uri))) == sorted(f"images/{p}" for p in drops[2] + drops[3])
    assert summary(report.uri)["files_seen"] == 16


def test_compression_level_gzips_the_records_and_keeps_them(tmp_path):
    import io

    from PIL import Image

    data = tmp_path / "data"
    for label, colour in (("red", (200, 10, 10)), ("blue", (10, 10, 200))):
        for n in range(6):
            out = io.BytesIO()
            Image.new("RGB", (64, 48), tuple(c + n for c in colour)).save(out, "BMP")  # compressible bytes
            write(data / label / f"{n}.bmp", out.getvalue())
    sizes, records = {}, {}
    for level in (0, 9):
        examples, _ = run_executor(data, tmp_path / f"out-{level}", compression_level=level)
        records[level] = by_filename(read_examples(examples.uri))
        sizes[level] = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(examples.uri) for f in fs if f.endswith(".gz")
        )
    assert {k: v["image/encoded"] for k, v in records[9].items()} == {
        k: v["image/encoded"] for k, v in records[0].items()
    }
    assert sizes[9] < sizes[0] / 5  # level 0 stores, level 9 deflates


# --- the stratified split (components/example_gen/splitting/stratify.py) -----------------------------------------


def _eval_share_of_each_class(examples_uri):
    found = by_filename(read_examples(examples_uri))
    per_class = {}
    for path, e in found.items():
        label = e["image/class/text"].decode()
        per_class.setdefault(label, {"train": [], "eval": []})[e["split"]].append(path)
    return found, per_class


def test_each_class_is_split_by_content_hash_within_one_image_of_the_eval_share(tmp_path):
    """A large class (its files near the boundary placed after the run), a small one (placed whole after the
    run) and one of two files: each class's eval count is within one image of 20%, a rare class is never
    missing from eval, and within a class the eval files are the last by content hash."""
    from components.example_gen.splitting import stratify

    data = tmp_path / "data"
    counts = {"common": 1200, "uncommon": 37, "rare": 2}
    for c, (label, n) in enumerate(counts.items()):
        for i in range(n):
            write(data / label / f"{i}.png", image_bytes("PNG", size=(6, 6), seed=c * 10_000 + i))
    examples, report = run_executor(data, tmp_path / "out")
    found, per_class = _eval_share_of_each_class(examples.uri)
    assert len(found) == sum(counts.values())  # nothing lost, nothing twice
    for label, n in counts.items():
        assert abs(len(per_class[label]["eval"]) - 0.2 * n) < 1, label
        assert per_class[label]["eval"], label  # never missing from eval
        order = sorted(
            per_class[label]["train"] + per_class[label]["eval"],
            key=lambda p: stratify.position(found[p]["image/key/sha256"].decode()),
        )
        assert sorted(order[-len(per_class[label]["eval"]) :]) == sorted(per_class[label]["eval"]), label
    assert summary(report.uri)["examples_per_split_and_class"]["eval"] == {
        label: len(per_class[label]["eval"]) for label in counts
    }
    # The common class was mostly written straight to its split: few of its files waited for the run's end.
    band = stratify.band(counts["common"], [0.8, 0.2])
    assert band[1] - band[0] < 0.15


def test_the_split_is_stable_when_a_span_adds_images(tmp_path):
    """10% more images per class move at most a couple of the earlier ones across the boundary."""
    data = tmp_path / "data"
    for label, n in (("cat", 300), ("dog", 60)):
        for i in range(n):
            write(data / label / f"{i}.png", image_bytes("PNG", size=(6, 6), seed=(label == "dog") * 10_000 + i))
    examples, _ = run_executor(data, tmp_path / "before")
    before, _ = _eval_share_of_each_class(examples.uri)
    for label, n in (("cat", 30), ("dog", 6)):
        for i in range(n):
            write(
                data / label / f"new-{i}.png",
                image_bytes("PNG", size=(6, 6), seed=50_000 + (label == "dog") * 1000 + i),
            )
    examples, _ = run_executor(data, tmp_path / "after")
    after, per_class = _eval_share_of_each_class(examples.uri)
    for label, n in (("cat", 330), ("dog", 66)):
        assert abs(len(per_class[label]["eval"]) - 0.2 * n) < 1
        moved = [
            p
            for p in before
            if before[p]["image/class/text"].decode() == label and before[p]["split"] != after[p]["split"]
        ]
        assert len(moved) <= 2, (label, moved)


def test_split_quotas_and_placement_by_rank():
    from components.example_gen.splitting import stratify

    assert stratify.quotas(10, [0.8, 0.2]) == [8, 2]
    assert stratify.quotas(12, [0.8, 0.2]) == [10, 2]  # 2.4 -> 2: within one image
    assert stratify.quotas(2, [0.8, 0.2]) == [1, 1]  # never missing from eval when it can be there
    assert stratify.quotas(1, [0.8, 0.2]) == [1, 0]  # one file: train
    assert stratify.quotas(7, [0.6, 0.2, 0.2]) == [4, 2, 1]  # largest remainder
    assert sum(stratify.quotas(1001, [0.75, 0.25])) == 1001
    # The band narrows as a class grows: a small class waits whole, a large one mostly not.
    assert stratify.band(10, [0.8, 0.2]) == (0.0, 1.0)
    lo, hi = stratify.band(100_000, [0.8, 0.2])
    assert 0.79 < lo < 0.8 < hi < 0.81
    # Pending files are placed by rank after the sure ones: of 10 cat images (8 train, 2 eval), 6 are already in
    # train, so the two pending files with the highest hashes go to eval...
    placed, notes = stratify.assign(
        ["train", "eval"],
        [0.8, 0.2],
        {"cat": {"train": 6}},
        {"cat": [("f" * 64, "d"), ("0" * 64, "a"), ("8" * 64, "b"), ("c" * 64, "c")]},
    )
    assert placed == {"a": "train", "b": "train", "c": "eval", "d": "eval"} and notes == []
    # ... and identical bytes (one hash) follow one split, even where the boundary falls between the copies.
    placed, _ = stratify.assign(
        ["train", "eval"],
        [0.8, 0.2],
        {"cat": {"train": 3}},
        {"cat": [("0" * 64, "a"), ("f" * 64, "b"), ("f" * 64, "c")]},
    )
    assert placed["b"] == placed["c"] == "train"


def test_a_failed_ingestion_keeps_its_quarantine_list_and_names_it(tmp_path):
    """TFX removes a failed execution's outputs: the list of bad files is kept beside them, and the one-line
    error names it (it said "details: <report>", and the report named none of them)."""
    import csv

    data = tmp_path / "data"
    make_class_tree(data, per_class=6)
    write(data / "bird" / "a.jpg", b"")  # the only files of a class, both bad: the model would lack the class
    write(data / "bird" / "b.jpg", b"not an image")
    with pytest.raises(IngestionError) as e:
        run_executor(data, tmp_path / "out" / "ImageExampleGen" / "1", max_bad_fraction=1.0)
    message = str(e.value)
    assert "classes with no valid image (every file of theirs was quarantined): 'bird'" in message
    kept = message.rsplit("every quarantined file, with its reason: ", 1)[1]
    with open(kept, newline="") as f:
        assert sorted(r["path"] for r in csv.DictReader(f)) == ["bird/a.jpg", "bird/b.jpg"]
    assert os.path.exists(os.path.join(os.path.dirname(kept), "summary.json"))


def test_rows_that_are_all_quarantined_name_the_commonest_reason(tmp_path):
    """Every row of an import file outside its folder: the reason, not "no file has a label"."""
    write(
        tmp_path / "data" / "import.csv",
        b"".join(f"/elsewhere/{n}.jpg,{'cat' if n % 2 else 'dog'}\n".encode() for n in range(6)),
    )
    with pytest.raises(IngestionError) as e:
        run_executor(tmp_path / "data", tmp_path / "out" / "ImageExampleGen" / "1")
    message = str(e.value)
    assert "none of the 6 files or rows is usable; the most common reason is outside_data_root (6)" in message
    assert "no file has a label" not in message and "\n" not in message
    kept = message.rsplit("with its reason: ", 1)[1]
    assert len(open(kept).read().splitlines()) == 7  # the header and the six rows


def test_a_class_with_no_eval_image_is_named_as_too_few_to_judge(tmp_path):
    """A class of one image (in train, none in eval) was left out of 'too few eval images to judge' (the card and
    data health read it) and of the Evaluator's recall line: both name it now."""
    from runs.run_text import describe_recalls

    data = tmp_path / "data"
    for c, (label, n) in enumerate({"cat": 60, "dog": 60, "lone": 1}.items()):
        for i in range(n):
            write(data / label / f"{i}.png", image_bytes("PNG", size=(6, 6), seed=c * 10_000 + i))
    _, report = run_executor(data, tmp_path / "out")
    found = summary(report.uri)
    assert found["examples_per_split_and_class"]["eval"].get("lone", 0) == 0
    assert found["classes_with_few_eval_examples"] == ["lone"]
    line = describe_recalls(
        {
            "per_class": {
                "cat": {"recall": 0.9, "support": 12},
                "dog": {"recall": 0.8, "support": 12},
                "lone": {"recall": None, "support": 0},
            }
        }
    )
    assert line.startswith("recall dog 0.80, cat 0.90; no eval images of lone")


def test_one_hash_split_takes_every_file(tmp_path):
    """An output config of a single hash split (TFX allows it): every file is in it, none waits for placement."""
    from tfx.proto import example_gen_pb2

    data = tmp_path / "data"
    make_class_tree(data, per_class=6)
    one = example_gen_pb2.Output(
        split_config=example_gen_pb2.SplitConfig(
            splits=[example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=1)]
        )
    )
    examples, report = run_executor(data, tmp_path / "out", output_config=one)
    assert {split: len(es) for split, es in read_examples(examples.uri).items()} == {"train": 12}
    assert summary(report.uri)["examples_per_split"] == {"train": 12} and summary(report.uri)["split_notes"] == []
