"""The pretrained backbone, EfficientNet-Lite0: the project's own builder with ImageNet weights from the installed
package (no download) classifies known photos as ImageNet does; a weights file that is not the one expected is
refused in one line; a hostile pickle is never run; and --model auto chooses it for photo-sized images only."""

import collections
import io
import json
import os
import pickle
import struct
import sys
import types

import numpy as np
import pytest
from conftest import image_bytes, write

from pipeline import model_choice, preflight
from pipeline.config import ConfigError, PipelineConfig
from trainer import efficientnet_lite, torch_checkpoint


def _center_crop(image: np.ndarray, size: int) -> np.ndarray:
    import tensorflow as tf

    h, w, _ = image.shape
    side = min(h, w)
    crop = image[(h - side) // 2 : (h - side) // 2 + side, (w - side) // 2 : (w - side) // 2 + side]
    return tf.image.resize(crop[None].astype("float32"), (size, size), antialias=True).numpy()


def test_the_builder_classifies_scikit_learns_sample_photos_as_imagenet_does():
    """china.jpg is a palace (ImageNet class 698), flower.jpg a daisy (985), at 224 px centre crops scaled as the
    reference does ((x - 127) / 128). Scrambled kernels (strides ignored), symmetric padding or the wrong scaling
    change or weaken these answers."""
    from sklearn.datasets import load_sample_image

    model = efficientnet_lite.build((224, 224, 3), include_top=True)
    path = efficientnet_lite.packaged_weights()
    efficientnet_lite.check_packaged(path)
    efficientnet_lite.load_pth(model, path)
    for name, expected in (("china.jpg", 698), ("flower.jpg", 985)):
        pixels = (_center_crop(load_sample_image(name), 224) - efficientnet_lite.MEAN) / efficientnet_lite.STDDEV
        probabilities = model(pixels, training=False).numpy()[0]
        ranked = probabilities.argsort()[::-1]
        assert ranked[0] == expected, (name, ranked[:5], probabilities[ranked[:5]])
        # Measured 0.33 and 0.21: label smoothing keeps the reference's answers modest; the runner-up far below.
        assert probabilities[expected] > 0.15 and probabilities[expected] > 1.2 * probabilities[ranked[1]]


def test_the_packaged_file_must_be_the_expected_one(tmp_path, monkeypatch):
    """Another file in the package's place (a damaged install, a changed release) is one line naming it and the fix,
    before anything runs; the run's pre-flight check says it as --weights imagenet."""
    real = efficientnet_lite.packaged_weights()
    changed = tmp_path / "efficientnet-lite0.pth"
    data = bytearray(open(real, "rb").read())
    data[-1] ^= 0xFF
    changed.write_bytes(bytes(data))
    with pytest.raises(efficientnet_lite.WeightsError) as caught:
        efficientnet_lite.check_packaged(str(changed))
    assert "not the efficientnet_lite0 ImageNet weights this code expects" in str(caught.value)
    assert "make install" in str(caught.value) and "\n" not in str(caught.value)

    monkeypatch.setattr(efficientnet_lite, "packaged_weights", lambda: str(changed))
    config = PipelineConfig(model="efficientnet_lite0", data=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^--weights imagenet: .*SHA-256 .*not the efficientnet_lite0 ImageNet"):
        preflight.check_imagenet_weights(config)


class _Storage:
    def __init__(self, key: str, count: int):
        self.key, self.count = key, count


class _Tensor:
    """A tensor as torch.save pickles it: a rebuild call on a storage (a persistent id), offset, shape, strides."""

    def __init__(self, key: str, count: int, shape, strides):
        self.storage, self.shape, self.strides = _Storage(key, count), shape, strides

    def __reduce__(self):
        rebuild = sys.modules["torch._utils"]._rebuild_tensor_v2
        return rebuild, (self.storage, 0, self.shape, self.strides, False, collections.OrderedDict())


def legacy_torch_file(path, tensors, monkeypatch):
    """Writes {name: (array, shape, strides)} as legacy torch.save does (each array is its storage, read through
    the view), with modules that stand in for torch's only while pickling (PyTorch is not installed)."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled")

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    storage_type = type("FloatStorage", (), {"__module__": "torch"})
    torch.FloatStorage, torch._utils = storage_type, utils
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return ("storage", storage_type, obj.key, "cpu", obj.count)
            return None

    def dump(obj, out):
        Pickler(out, protocol=2).dump(obj)

    state = collections.OrderedDict()
    storages = []
    for n, (name, (array, shape, strides)) in enumerate(tensors.items()):
        state[name] = _Tensor(str(n), array.size, shape, strides)
        storages.append((str(n), np.asarray(array, "<f4")))
    out = io.BytesIO()
    for header in (
        torch_checkpoint.MAGIC_NUMBER,
        torch_checkpoint.PROTOCOL_VERSION,
        {"protocol_version": 1001, "little_endian": True},
    ):
        dump(header, out)
    dump(state, out)
    dump([key for key, _ in storages], out)
    for _, array in storages:
        out.write(struct.pack("<q", array.size) + array.tobytes())
    monkeypatch.undo()
    write(path, out.getvalue())
    return str(path)


def test_views_are_read_with_their_strides_and_other_shapes_are_refused(tmp_path, monkeypatch):
    # A kernel stored in TensorFlow's order ([h, w, in, out]) and described as PyTorch's [out, in, h, w] view:
    # what the packaged file holds. Read as contiguous, it would come back scrambled.
    hwio = np.arange(2 * 3 * 4 * 5, dtype="<f4").reshape(2, 3, 4, 5)
    strides = (1, 5, 4 * 5 * 3, 4 * 5)  # out, in, h, w over the [h, w, in, out] buffer
    path = legacy_torch_file(tmp_path / "view.pth", {"kernel": (hwio, (5, 4, 2, 3), strides)}, monkeypatch)
    with open(path, "rb") as f:
        state = torch_checkpoint.read_state_dict(f)
    assert np.array_equal(state["kernel"], hwio.transpose(3, 2, 0, 1))

    stem = np.zeros((32, 3, 3, 3), "<f4")  # the stem of a network with 4 input channels is not Lite0's
    wrong = legacy_torch_file(
        tmp_path / "other.pth",
        {"_conv_stem.weight": (np.zeros(32 * 4 * 9, "<f4"), (32, 4, 3, 3), (36, 9, 3, 1))},
        monkeypatch,
    )
    model = efficientnet_lite.build((32, 32, 3))
    with pytest.raises(efficientnet_lite.WeightsError) as caught:
        efficientnet_lite.load_pth(model, wrong)
    assert "_conv_stem has shapes [(3, 3, 4, 32)], the network needs [(3, 3, 3, 32)]" in str(caught.value)
    missing = legacy_torch_file(
        tmp_path / "part.pth", {"_conv_stem.weight": (stem, (32, 3, 3, 3), (27, 9, 3, 1))}, monkeypatch
    )
    with pytest.raises(efficientnet_lite.WeightsError, match=r"part.pth: not EfficientNet-Lite0 weights \(_bn0"):
        efficientnet_lite.load_pth(model, missing)


def test_a_pickle_that_names_anything_else_is_refused_never_run(tmp_path):
    """A .pth is a pickle: one that calls os.system (or any name a state dict does not need) is refused in one
    line, and what it would have run never runs."""
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = write(tmp_path / "hostile.pth", pickle.dumps(Hostile(), protocol=2))
    with pytest.raises(efficientnet_lite.WeightsError) as caught:
        efficientnet_lite.load_pth(efficientnet_lite.build((32, 32, 3)), path)
    assert "which a state dict of tensors does not need" in str(caught.value) and "system" in str(caught.value)
    assert not marker.exists()
    cut = write(tmp_path / "cut.pth", open(efficientnet_lite.packaged_weights(), "rb").read()[:400_000])
    with pytest.raises(efficientnet_lite.WeightsError, match="cut short"):
        efficientnet_lite.load_pth(efficientnet_lite.build((32, 32, 3)), cut)


def _images(folder, side, count=6):
    for n in range(count):
        for label in ("a", "b"):
            write(
                os.path.join(folder, label, f"{n}.jpg"), image_bytes(size=(side + n, side), seed=n * 2 + (label == "b"))
            )
    return str(folder)


def test_auto_takes_the_pretrained_backbone_for_photo_sized_images_and_the_cnn_for_small_ones(tmp_path):
    photos = preflight.preflight(PipelineConfig(data=_images(tmp_path / "photos", 200), root=str(tmp_path / "r"))).found
    small = preflight.preflight(PipelineConfig(data=_images(tmp_path / "small", 40), root=str(tmp_path / "r"))).found
    assert photos["model_choice"] == model_choice.Choice(
        "efficientnet_lite0", "photo-sized images, median shorter side 200 px over 12 sampled images"
    )
    assert (
        small["model_choice"].model == "cnn"
        and "small images, median shorter side 40 px" in small["model_choice"].reason
    )
    config = model_choice.resolved(PipelineConfig(data=str(tmp_path / "photos")), photos["model_choice"])
    assert (config.model, config.hparams().image_size, config.hparams().model_choice) == (
        "efficientnet_lite0",
        224,
        photos["model_choice"].reason,
    )
    given = PipelineConfig(model="cnn", data=str(tmp_path / "photos"), root=str(tmp_path / "r"))
    assert preflight.preflight(given).found["model_choice"] is None  # a model given is kept
    # An image size the chosen backbone cannot take is one line that says what chose it.
    with pytest.raises(ConfigError, match=r"--image-size 16: use 32 to 1024 .* \(photo-sized images, .*give --model"):
        model_choice.resolved(PipelineConfig(data=str(tmp_path / "photos"), image_size=16), photos["model_choice"])
    # Files that do not open as images are not measured (ingestion quarantines them).
    write(tmp_path / "broken" / "a" / "x.jpg", b"not an image")
    assert model_choice.choose([str(tmp_path / "broken" / "a" / "x.jpg")]).model == "efficientnet_lite0"


def test_a_compiled_job_takes_the_pretrained_backbone_without_reading_its_images():
    from kubeflow import deploy
    from pipeline.cloud_config import CloudConfig

    config = PipelineConfig(name="imagepipe", data="gs://bucket-1/images").validate()
    cloud = CloudConfig(
        project="proj-1",
        region="europe-west4",
        pipeline_root="gs://bucket-1/pipelines",
        image="us-central1-docker.pkg.dev/proj-1/imagepipe/pipeline:v7",
    ).validate(config)
    job = deploy.build_job(config, cloud)
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    assert "BackboneFeatures" in tasks
    trainer = json.dumps(tasks["Trainer"])
    assert "efficientnet_lite0" in trainer and "a compiled job, chosen without reading its images" in trainer


def test_weights_are_checked_before_any_stage_and_a_storage_larger_than_its_file_is_never_allocated(
    tmp_path, monkeypatch
):
    from pipeline.config import PipelineConfig

    small = legacy_torch_file(tmp_path / "small.pth", {"w": (np.arange(7, dtype="<f4"), (1,), (1,))}, monkeypatch)
    data = open(small, "rb").read()
    assert data.count(b"K\x07") == 1 and data.count(struct.pack("<q", 7)) == 1  # the storage's count, twice said
    huge = 2**40  # four TiB of floats
    claimed = data.replace(b"K\x07", b"\x8a\x06" + huge.to_bytes(6, "little")).replace(
        struct.pack("<q", 7), struct.pack("<q", huge)
    )
    path = write(tmp_path / "huge.pth", claimed)
    with pytest.raises(torch_checkpoint.CheckpointError, match="claims 1,099,511,627,776 elements, more than the file"):
        with open(path, "rb") as f:
            torch_checkpoint.read_state_dict(f)
    not_h5 = write(tmp_path / "notes.weights.h5", b"my notes")
    for given, said in (
        (path, "not a torch.save weights file (storage 0 is cut short: it claims 1,099,511,627,776 elements"),
        (not_h5, "not a Keras weights file (no HDF5 header)"),
        (write(tmp_path / "w.bin", b"x"), "not a weights file by its name"),
    ):
        with pytest.raises(ConfigError) as caught:
            PipelineConfig(data=str(tmp_path), model="efficientnet_lite0", weights=str(given)).validate_training()
        assert str(caught.value).startswith(f"--weights {given}: {said}"), str(caught.value)
    PipelineConfig(model="efficientnet_lite0", weights=small).validate_training()  # a readable .pth passes
