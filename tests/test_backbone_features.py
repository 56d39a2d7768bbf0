"""BackboneFeatures' executor with real Beam, a real backbone and real TFRecords: features computed once,
reused from the content-addressed cache, never read half-written, shared safely by two pipelines."""

import json
import multiprocessing
import os
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf
from tfx.types import artifact_utils, standard_artifacts

from components.features import SUMMARY_FILE, backbone, executor, feature_cache, runtimes
from trainer import features, models
from trainer.artifact_files import FEATURES_SOURCE_FILE
from trainer.hparams import HParams

SIZE = 32
MODEL = "efficientnet_lite0"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Two weights files of the pretrained backbone: EfficientNet-Lite0's ImageNet weights (from the installed
    package) as a Keras weights file, and the same with every weight nudged by 1%: two sources of weights."""
    folder = tmp_path_factory.mktemp("weights")
    backbone = models.make_backbone(HParams(model=MODEL, image_size=SIZE))  # --weights imagenet
    paths = [str(folder / "imagenet.weights.h5"), str(folder / "nudged.weights.h5")]
    backbone.save_weights(paths[0])
    rng = np.random.default_rng(0)
    for weight in backbone.weights:
        weight.assign(weight.numpy() * (1 + 0.01 * rng.standard_normal(weight.shape)).astype("float32"))
    backbone.save_weights(paths[1])
    return paths


def transformed(folder, counts=(("train", 20), ("eval", 6)), seed=0):
    """Records as Transform writes them (pixels, label, key), in Split-<name>/ folders; returns the artifact."""
    rng = np.random.default_rng(seed)
    for split, count in counts:
        os.makedirs(os.path.join(folder, f"Split-{split}"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(folder, f"Split-{split}", "part-0.gz"), options="GZIP") as writer:
            for n in range(count):
                pixels = rng.integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                features.PIXELS_KEY: tf.train.Feature(
                                    bytes_list=tf.train.BytesList(value=[tf.io.serialize_tensor(pixels).numpy()])
                                ),
                                features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[n % 3])),
                                features.KEY: tf.train.Feature(
                                    bytes_list=tf.train.BytesList(value=[f"{split}-{n}".encode()])
                                ),
                            }
                        )
                    ).SerializeToString()
                )
    artifact = standard_artifacts.Examples()
    artifact.uri = str(folder)
    artifact.split_names = artifact_utils.encode_split_names([split for split, _ in counts])
    return artifact


def run(source, out_dir, cache, weights_file, **hparams):
    """Executor.Do as the TFX launcher runs it; returns (summary, {split: [(key, features, label)]})."""
    output = standard_artifacts.Examples()
    output.uri = str(out_dir)
    hp = HParams(model=MODEL, image_size=SIZE, weights=weights_file, **hparams)
    context = executor.Executor.Context(beam_pipeline_args=[], tmp_dir=str(out_dir))
    executor.Executor(context).Do(
        {executor.INPUT_KEY: [source]},
        {executor.OUTPUT_KEY: [output]},
        {executor.HPARAMS_KEY: json.dumps(hp.features_config()), executor.CACHE_KEY: str(cache)},
    )
    summary = json.load(open(os.path.join(out_dir, SUMMARY_FILE)))
    found = {}
    for split in artifact_utils.decode_split_names(output.split_names):
        files = tf.io.gfile.glob(os.path.join(out_dir, f"Split-{split}", "*"))
        spec = {
            features.FEATURES_KEY: tf.io.VarLenFeature(tf.float32),
            features.KEY: tf.io.FixedLenFeature([], tf.string),
            features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        }
        rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]  # uncompressed
        found[split] = sorted(
            (
                r[features.KEY].numpy().decode(),
                tf.sparse.to_dense(r[features.FEATURES_KEY]).numpy(),
                int(r[features.LABEL_KEY]),
            )
            for r in rows
        )
    return summary, found


def _pixels(source, split):
    files = tf.io.gfile.glob(os.path.join(source.uri, f"Split-{split}", "*"))
    spec = {
        features.PIXELS_KEY: tf.io.FixedLenFeature([], tf.string),
        features.KEY: tf.io.FixedLenFeature([], tf.string),
    }
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    return {
        r[features.KEY].numpy().decode(): features.decode_pixels(r[features.PIXELS_KEY][None], SIZE, 3)[0] for r in rows
    }


def assert_same_features(got, expected):
    """Features of one image from two computations of the same graph (batched or not, the graph frozen or the
    Keras model): equal up to oneDNN's rounding, which differs by batch size and CPU instruction set (3e-5 here,
    1.03e-4 on another x86 machine, on vectors of magnitude ~5). Relative to the vector's size, with a margin of
    ~50x over that, and a cosine of 1 to six places: a wrong graph (scaling, BatchNorm, pooling) misses both by
    far more."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 1e-3 * scale, (np.abs(got - expected).max(), scale)
    assert got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected)) > 1 - 1e-6


def test_features_are_the_backbone_output_computed_once_then_reused(tmp_path, weights, monkeypatch):
    source = transformed(tmp_path / "transformed")
    cache = tmp_path / "cache"
    made, make_backbone = [], models.make_backbone
    monkeypatch.setattr(models, "make_backbone", lambda *a, **k: made.append(a) or make_backbone(*a, **k))
    first, found = run(source, tmp_path / "a", cache, weights[0])
    monkeypatch.undo()
    assert (first["images"], first["computed"], first["reused"], first["dim"]) == (26, 26, 0, 1280)
    assert len(made) == 1  # prepare(), to fingerprint the weights and freeze the graph the workers load
    assert [len(found["train"]), len(found["eval"])] == [20, 6]
    # What the model's own feature extractor gives for the pixels (the weights as stored in the cache).
    hp = HParams(model=MODEL, image_size=SIZE)
    source_info = json.load(open(tmp_path / "a" / FEATURES_SOURCE_FILE))
    assert source_info["transformed_examples"] == source.uri and source_info["dim"] == 1280
    # the backbone's weights are in the artifact (a copy of the cache's): a cache cleared leaves the Trainer them
    assert source_info["backbone_weights"] == str(tmp_path / "a" / "backbone.weights.h5")
    extractor = models.feature_extractor(hp, models.make_backbone(hp, source_info["backbone_weights"]))
    pixels = _pixels(source, "eval")
    for key, vector, label in found["eval"]:
        expected = extractor(pixels[key][None], training=False).numpy()[0]
        assert_same_features(vector, expected)  # the frozen graph, batched, vs the Keras model on one image
        assert label == int(key.split("-")[1]) % 3
    assert np.std([v for _, v, _ in found["eval"]], axis=0).mean() > 1e-3  # features vary with the image

    second, again = run(source, tmp_path / "b", cache, weights[0])  # a rerun: nothing computed again
    assert (second["computed"], second["reused"]) == (0, 26)
    assert first["backbone_seconds"] > 0 and second["backbone_seconds"] == 0  # where the time went, in the summary
    assert all(np.array_equal(x[1], y[1]) for split in found for x, y in zip(found[split], again[split]))

    # Damaged and half-written packs and entries are never read: computed again.
    packs = sorted(
        (cache / first["fingerprint"]).rglob("*" + feature_cache.PACK_SUFFIX),
        key=lambda p: -feature_cache.Pack.entries_in(p.stat().st_size, 1280),
    )  # train's 20, eval's 6
    entry = feature_cache.Pack.entry_bytes(1280)
    with open(packs[0], "r+b") as f:  # a copy cut short (a full disk): its last two entries lost
        f.truncate(packs[0].stat().st_size - entry - 10)
        f.seek(feature_cache.Pack.offset(1280, 20, 0))
        f.write(os.urandom(entry))  # the right length, random bytes (a damaged disk)
        nan = np.full(1280, np.nan, "<f4").tobytes()
        f.write(nan + zlib.crc32(nan).to_bytes(4, "little"))  # whole, its checksum right, not finite
    os.rename(packs[1], str(packs[1]) + ".tmp-deadbeef")  # an interrupted write: only its temporary file

    graph = cache / first["fingerprint"] / feature_cache.GRAPH_FILE
    with open(graph, "r+b") as f:  # 4 KB overwritten in place: it still parses, and would compute other features
        f.seek(graph.stat().st_size // 2)
        f.write(os.urandom(4096))
    # ... its digest no longer matches: the workers make it again from the weights, once

    grown = transformed(tmp_path / "grown", counts=(("train", 23), ("eval", 6)))  # and 3 images added
    monkeypatch.setattr(models, "make_backbone", lambda *a, **k: made.append(a) or make_backbone(*a, **k))
    third, refound = run(grown, tmp_path / "c", cache, weights[0])
    monkeypatch.undo()
    assert (third["computed"], third["reused"]) == (2 + 1 + 1 + 6 + 3, 26 - 10)
    assert len(made) == 2 and graph.stat().st_size > 4 * 1280 * 100  # the weights are in it as constants
    assert os.path.exists(packs[0]) and os.path.exists(str(packs[1]) + ".tmp-deadbeef")  # never changed
    assert all(np.isfinite(v).all() for _, v, _ in refound["train"] + refound["eval"])
    # The four computed again, in a batch of their own, agree within oneDNN's rounding of other batch sizes.
    old = {key: vector for key, vector, _ in found["train"] + found["eval"]}
    for key, vector, _ in refound["train"]:  # (train-0..19 hold the same pixels in both; the eval images moved on)
        if key in old:
            assert_same_features(vector, old[key])

    other, _ = run(source, tmp_path / "d", cache, weights[1])  # other weights: never the first's features
    assert (other["computed"], other["reused"]) == (26, 0) and other["fingerprint"] != first["fingerprint"]
    assert len(feature_cache.describe(str(cache))) == 2


def test_the_backbone_runs_on_onnx_runtime_without_an_accelerator_and_only_where_it_agrees(tmp_path, weights, caplog):
    """The frozen graph runs on ONNX Runtime on CPUs (1.5x TensorFlow's speed: components/features/runtimes.py), its
    features TensorFlow's own; a runtime that disagrees with TensorFlow's is not used."""
    hp = HParams(model=MODEL, image_size=SIZE, weights=weights[0])
    prepared = backbone.prepare(hp, str(tmp_path / "cache"))
    extract = backbone.load_extractor(hp, prepared)
    accelerated = bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
    assert extract.runtime == (runtimes.TENSORFLOW if accelerated else runtimes.ONNX)
    graph_def = tf.compat.v1.GraphDef.FromString(open(prepared.graph_file, "rb").read())
    graph = backbone.in_tensorflow(hp, graph_def)
    pixels = np.stack(list(_pixels(transformed(tmp_path / "transformed"), "eval").values())).astype(np.float32)
    expected = graph(tf.constant(pixels)).numpy()
    for got, want in zip(extract(pixels), expected):
        assert_same_features(got, want)
    # The conversion that agreed is kept beside the graph, for the next process; a damaged one is converted again.
    folder = os.path.dirname(prepared.graph_file)
    kept = os.path.join(folder, feature_cache.ONNX_FILE)
    assert os.path.exists(kept) != accelerated
    if not accelerated:
        model = open(kept, "rb").read()
        assert np.array_equal(backbone.load_extractor(hp, prepared)(pixels), extract(pixels))  # the kept one
        with open(kept, "r+b") as f:
            f.seek(len(model) // 2)
            f.write(os.urandom(64))
        damaged = open(kept, "rb").read()
        again = backbone.load_extractor(hp, prepared)
        assert again.runtime == runtimes.ONNX and open(kept, "rb").read() != damaged  # converted and kept again
        for got, want in zip(again(pixels), expected):
            assert_same_features(got, want)

    # A TensorFlow that computes other features (its graph's output 0.1% larger) keeps TensorFlow, and says why.
    nudged = runtimes.choose(
        graph_def, lambda p: graph(p) * 1.001, backbone.GRAPH_INPUT, backbone.GRAPH_OUTPUT, pixels.shape[1:]
    )
    assert nudged.runtime == runtimes.TENSORFLOW
    assert np.allclose(nudged(pixels), expected * 1.001, rtol=1e-6)
    if not accelerated:
        assert "ONNX Runtime's features differ from TensorFlow's by 0.001 of the largest" in caplog.text


def _run_in_process(args):
    source_dir, out_dir, cache, weights_file = args
    source = transformed(source_dir)  # the same records, written by each process into its own folder
    summary, found = run(source, out_dir, cache, weights_file)
    return summary["images"], [v.tolist() for _, v, _ in found["train"]]


def test_two_pipelines_writing_one_cache_at_once(tmp_path, weights):
    cache = str(tmp_path / "cache")
    jobs = [(str(tmp_path / f"src-{n}"), str(tmp_path / f"out-{n}"), cache, weights[0]) for n in range(2)]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        (images_a, train_a), (images_b, train_b) = pool.map(_run_in_process, jobs)
    assert images_a == images_b == 26 and np.array_equal(train_a, train_b)
    (described,) = feature_cache.describe(cache)
    index = feature_cache.FeatureCache(cache, described["fingerprint"], 1280).index()
    assert len(set(index.digests)) == 26  # every image's features, whoever wrote them (maybe both: the same bytes)
    assert not [p for p in (tmp_path / "cache").rglob("*.tmp-*")]


def test_augmented_views_are_cached_for_the_training_split_only(tmp_path, weights):
    source = transformed(tmp_path / "transformed")
    cache = tmp_path / "cache"
    summary, found = run(source, tmp_path / "a", cache, weights[0], augment="flip,crop", augment_views=2)
    assert summary["views"] == {"train": 2, "eval": 0}
    assert (summary["computed"], summary["reused"]) == (20 * 3 + 6, 0)
    train = np.stack([v for _, v, _ in found["train"]]).reshape(20, 3, 1280)
    assert all(not np.allclose(views[0], views[v]) for views in train for v in (1, 2))  # each view its own
    assert all(v.shape == (1280,) for _, v, _ in found["eval"])
    plain, _ = run(source, tmp_path / "b", cache, weights[0])  # the plain features were cached with the views
    assert (plain["computed"], plain["reused"]) == (0, 26)
    again, refound = run(source, tmp_path / "c", cache, weights[0], augment="flip,crop", augment_views=2)
    assert (again["computed"], again["reused"]) == (0, 66)
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(found["train"], refound["train"]))


def test_the_cache_is_bounded_by_dropping_the_least_recently_used_backbone(tmp_path):
    cache = str(tmp_path / "cache")
    for fingerprint, used in (("old", "0"), ("new", None)):
        entries = feature_cache.FeatureCache(cache, fingerprint, dim=4)
        for n in range(10):
            entries.put(f"{n:064x}", np.arange(4, dtype=np.float32))
        feature_cache.write_whole(
            os.path.join(cache, fingerprint, feature_cache.INFO_FILE), b'{"model": "m", "dim": 4}'
        )
        feature_cache.touch(cache, fingerprint)
        if used:
            open(os.path.join(cache, fingerprint, feature_cache.LAST_USED), "w").write(used)  # long ago
    sizes = {d["fingerprint"]: d["bytes"] for d in feature_cache.describe(cache)}
    assert [d["entries"] for d in feature_cache.describe(cache)] == [10, 10]
    removed = feature_cache.prune(cache, sizes["new"])
    assert [d["fingerprint"] for d in removed] == ["old"]
    assert [d["fingerprint"] for d in feature_cache.describe(cache)] == ["new"]
    assert feature_cache.prune(cache, 0) and feature_cache.describe(cache) == []


def test_a_known_weights_file_needs_no_backbone_to_find_its_fingerprint(tmp_path, weights, monkeypatch):
    """The first run notes which fingerprint a weights file gave; later runs with the same bytes read the note
    instead of making and hashing a backbone. Other bytes under the same name are another source."""
    from components.features import backbone

    cache = str(tmp_path / "cache")
    path = str(tmp_path / "backbone.weights.h5")
    with open(path, "wb") as f:
        f.write(open(weights[0], "rb").read())
    hp = HParams(model=MODEL, image_size=SIZE, weights=path)
    first = backbone.prepare(hp, cache)
    assert os.listdir(os.path.join(cache, feature_cache.SOURCES_DIR)) == [backbone.source_key(hp) + ".json"]

    def no_backbone(*args, **kwargs):
        raise AssertionError("a backbone was made")

    monkeypatch.setattr(models, "make_backbone", no_backbone)
    assert backbone.prepare(hp, cache) == first
    with open(path, "wb") as f:  # the same name, other weights: made (and refused here), never the old fingerprint
        f.write(open(weights[1], "rb").read())
    with pytest.raises(AssertionError, match="a backbone was made"):
        backbone.prepare(hp, cache)
    assert [d["fingerprint"] for d in feature_cache.describe(cache)] == [first.fingerprint]  # sources/ is no backbone
    monkeypatch.undo()


def test_a_damaged_cache_is_made_whole_again_and_an_unwritable_one_is_one_line(tmp_path, weights):
    """A backbone.weights.h5 cut short (a copy of the cache, a full disk) failed every later run in h5py: its
    SHA-256 is noted, and a file that does not match is written again from the backbone. A cache folder that
    cannot be written is one line naming it (it was a PermissionError traceback)."""
    from components.features import backbone

    cache = str(tmp_path / "cache")
    hp = HParams(model=MODEL, image_size=SIZE, weights=weights[0])
    first = backbone.prepare(hp, cache)
    whole = open(first.weights_file, "rb").read()
    with open(first.weights_file, "r+b") as f:
        f.truncate(len(whole) // 3)
    again = backbone.prepare(hp, cache)
    assert again == first and os.path.getsize(again.weights_file) == len(whole)
    loaded = models.make_backbone(hp, again.weights_file)  # it raised OSError (truncated file) in h5py
    given = models.make_backbone(hp, weights[0])
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), given.get_weights()))

    blocked = tmp_path / "a-file"  # a cache under a file: what a read-only folder is to a user who is not root
    blocked.write_bytes(b"x")
    with pytest.raises(feature_cache.CacheError, match=f"the features cache cannot be written at {blocked}/cache"):
        backbone.prepare(hp, str(blocked / "cache"))


@pytest.mark.parametrize("label,key", [(0, b"3f" * 32), (7, b""), (-1, b"x"), (300, "ünï".encode())])
def test_feature_examples_are_the_tf_examples_tensorflow_writes(label, key):
    """The features step writes its examples' bytes itself (fast); they parse as tf.train.Example does them."""
    vector = np.random.default_rng(label + 2).normal(size=(3 * 1280,)).astype(np.float32)
    written = executor.feature_example(vector, label, key)
    expected = tf.train.Example(
        features=tf.train.Features(
            feature={
                features.FEATURES_KEY: tf.train.Feature(float_list=tf.train.FloatList(value=vector)),
                features.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                features.KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[key])),
            }
        )
    )
    assert tf.train.Example.FromString(written) == expected
    parsed = tf.io.parse_single_example(
        written,
        {
            features.FEATURES_KEY: tf.io.FixedLenFeature([3 * 1280], tf.float32),
            features.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
            features.KEY: tf.io.FixedLenFeature([], tf.string),
        },
    )
    assert np.array_equal(parsed[features.FEATURES_KEY].numpy(), vector)
    assert (int(parsed[features.LABEL_KEY]), parsed[features.KEY].numpy()) == (label, key)


def read_cache_main():
    """sys.argv ROOT FINGERPRINT DIM KEY...: prints one JSON line: each key's cached vector (None: not found) and
    the cache root described. For a test that reads a cache on (a stand-in for) Cloud Storage (run_helper)."""
    root, fingerprint, dim, *keys = sys.argv[1:]
    got = feature_cache.FeatureCache(root, fingerprint, int(dim)).get_many(keys)
    print(
        json.dumps(
            {
                "vectors": [None if v is None else v.tolist() for v in got],
                "described": [
                    {k: d[k] for k in ("fingerprint", "entries", "bytes", "model")}
                    for d in feature_cache.describe(root)
                ],
            }
        )
    )


def test_a_cache_on_cloud_storage_is_read_a_pack_at_a_time_and_listed(tmp_path):
    """A cache on gs:// (the real client against a local stand-in of Cloud Storage): a run reads each pack's keys
    once and then the span of each pack it needs in one request, not an object per image; `imagepipe cache`'s
    listing counts its entries and bytes there as on disk."""
    from commands import run_helper
    from fake_endpoints import FakeService

    bucket = tmp_path / "bucket"
    cache = feature_cache.FeatureCache(str(bucket / "cache"), "fp", dim=4)
    vectors = {f"{p}-{i}": np.arange(4, dtype=np.float32) + 10 * p + i for p in range(3) for i in range(100)}
    for p in range(3):  # three batches, three packs
        cache.put_many([f"{p}-{i}" for i in range(100)], np.stack([vectors[f"{p}-{i}"] for i in range(100)]))
    feature_cache.write_whole(str(bucket / "cache" / "fp" / feature_cache.INFO_FILE), b'{"model": "m", "dim": 4}')
    feature_cache.touch(str(bucket / "cache"), "fp")
    wanted = [f"{p}-{i}" for p in range(3) for i in range(0, 100, 3)]  # a third of each pack
    with FakeService(buckets={"photos-1": str(bucket)}) as gcs:
        done = run_helper(
            "test_backbone_features:read_cache_main",
            "gs://photos-1/cache",
            "fp",
            "4",
            *wanted,
            "not-cached",
            env={
                **os.environ,
                "STORAGE_EMULATOR_HOST": gcs.url,
                "GOOGLE_APPLICATION_CREDENTIALS": gcs.credentials_file(str(tmp_path)),
            },
            timeout=300,
        )
        reads = gcs.find("GET", r"^/download/storage/v1/b/photos-1/o/.*\.pack$")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["vectors"][:-1] == [vectors[key].tolist() for key in wanted] and found["vectors"][-1] is None
    assert len(reads) == 3 + 3  # each pack's keys, then its span: 6 requests for 102 lookups
    ((described),) = found["described"]
    packs = list((bucket / "cache" / "fp" / feature_cache.PACKS_DIR).iterdir())
    assert (described["fingerprint"], described["entries"], described["model"]) == ("fp", 300, "m")
    assert described["bytes"] == sum(p.stat().st_size for p in (bucket / "cache" / "fp").rglob("*") if p.is_file())
    assert len(packs) == 3
