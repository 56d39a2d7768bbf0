"""Listing sources: layouts, manifests, odd names, and the one-line errors for unusable input."""

import os
import unicodedata

import pytest
from conftest import image_bytes, make_class_tree, write

from images.finding import sources
from images.image_check import Reason


def _by_path(listing):
    return {c.rel_path: c for c in listing.candidates}


def test_class_folders_nested_unicode_and_spaces(tmp_path):
    write(tmp_path / "cat" / "2021" / "summer" / "a b.JPG", image_bytes())
    write(tmp_path / "chat é" / "mon image 1.jpeg", image_bytes(seed=1))
    write(tmp_path / "dog" / "noext", image_bytes(seed=2))
    write(tmp_path / "README.txt", b"about this dataset")
    write(tmp_path / ".DS_Store", b"\0")
    write(tmp_path / "dog" / ".hidden.jpg", image_bytes(seed=3))
    write(tmp_path / ".ipynb_checkpoints" / "x.jpg", image_bytes(seed=4))
    listing = sources.list_source(str(tmp_path), str(tmp_path))
    got = _by_path(listing)
    assert listing.layout == "folders"
    assert got["cat/2021/summer/a b.JPG"].label == "cat"  # nested folders keep the top class
    assert got["chat é/mon image 1.jpeg"].label == "chat é"
    assert got["dog/noext"].label == "dog"
    assert got["README.txt"].problem[0] == Reason.MISSING_LABEL
    assert listing.skipped_hidden == 3
    assert listing.classes == ["cat", "chat é", "dog"]


def test_labels_are_nfc_normalised(tmp_path):
    decomposed = unicodedata.normalize("NFD", "café")  # as macOS writes file names
    write(tmp_path / decomposed / "a.jpg", image_bytes())
    write(tmp_path / "café" / "b.jpg", image_bytes(seed=1))
    listing = sources.list_source(str(tmp_path), str(tmp_path))
    assert listing.classes == ["café"]


def test_presplit_layout_is_detected_with_aliases(tmp_path):
    write(tmp_path / "train" / "cat" / "a.jpg", image_bytes())
    write(tmp_path / "validation" / "cat" / "b.jpg", image_bytes(seed=1))
    write(tmp_path / "test" / "dog" / "c.jpg", image_bytes(seed=2))
    listing = sources.list_source(str(tmp_path), str(tmp_path))
    got = _by_path(listing)
    assert listing.layout == "presplit"
    assert (got["train/cat/a.jpg"].split, got["validation/cat/b.jpg"].split, got["test/dog/c.jpg"].split) == (
        "train",
        "eval",
        "test",
    )
    assert got["validation/cat/b.jpg"].label == "cat"


def test_class_folder_named_like_a_split_is_not_presplit_without_train(tmp_path):
    make_class_tree(tmp_path, classes=("test", "dog"), per_class=1)
    assert sources.list_source(str(tmp_path), str(tmp_path)).layout == "folders"


def test_manifest_rows_and_their_problems(tmp_path):
    data = tmp_path / "data"
    write(data / "imgs" / "a b.jpg", image_bytes())
    write(data / "imgs" / "é.png", image_bytes("PNG", seed=1))
    write(tmp_path / "outside.jpg", image_bytes(seed=2))
    os.mkdir(data / "afolder")
    manifest = write(
        data / "labels.csv",
        (
            "\ufeffPath,Label,Split\n"  # BOM and capitalised header, as Excel writes
            "imgs/a b.jpg,cat,train\n"
            "imgs/é.png, dog ,\n"  # empty split: by hash; label is stripped
            "../outside.jpg,cat,train\n"
            "imgs/missing.jpg,cat,eval\n"
            "imgs/a b.jpg,,train\n"
            "imgs/a b.jpg,cat,holdout\n"
            "afolder,cat,train\n"
            "\n"
            ",cat,train\n"
        ).encode("utf-8"),
    )
    listing = sources.list_source(str(data), manifest)
    rows = listing.candidates
    assert listing.layout == "manifest"
    assert (rows[0].rel_path, rows[0].label, rows[0].split, rows[0].problem) == ("imgs/a b.jpg", "cat", "train", None)
    assert (rows[1].rel_path, rows[1].label, rows[1].split) == ("imgs/é.png", "dog", None)
    assert rows[2].problem[0] == Reason.OUTSIDE_ROOT and "line 4" in rows[2].problem[1]
    assert rows[3].problem is None  # a missing file is reported by the reader (missing_file)
    assert rows[4].problem[0] == Reason.MISSING_LABEL
    assert rows[5].problem[0] == Reason.UNKNOWN_SPLIT and "holdout" in rows[5].problem[1]
    assert rows[6].problem[0] == Reason.UNREADABLE
    assert rows[7].problem[0] == Reason.MISSING_FILE
    assert len(rows) == 8  # the blank line is not a row


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"photo-1,cat\n", "header naming the columns path,label"),  # (a.jpg,cat: an AutoML import row)
        (b"", "header naming the columns path,label"),
        (b"path,label\n", "no rows"),
        (b"\xff\xfe\x00bad", "not UTF-8"),
    ],
)
def test_unusable_manifests_fail_in_one_line(tmp_path, content, expected):
    manifest = write(tmp_path / "m.csv", content)
    with pytest.raises(sources.DataError) as caught:
        sources.list_source(str(tmp_path), manifest)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_unusable_folders_fail_in_one_line(tmp_path):
    os.mkdir(tmp_path / "empty")
    with pytest.raises(sources.DataError, match="no image files found"):
        sources.list_source(str(tmp_path), str(tmp_path / "empty"))
    with pytest.raises(sources.DataError, match="no such file or folder"):
        sources.list_source(str(tmp_path), str(tmp_path / "nope"))
    make_class_tree(tmp_path / "one", classes=("cat",), per_class=2)
    with pytest.raises(sources.DataError, match="only one class"):
        sources.check_usable(sources.list_source(str(tmp_path), str(tmp_path / "one")))


def test_pipes_and_broken_links_are_quarantined_not_opened(tmp_path):
    make_class_tree(tmp_path, per_class=1)
    os.mkfifo(tmp_path / "cat" / "pipe.jpg")  # opening it would block forever
    os.symlink(tmp_path / "nowhere.jpg", tmp_path / "dog" / "link.jpg")
    got = _by_path(sources.list_source(str(tmp_path), str(tmp_path)))
    assert got["cat/pipe.jpg"].problem == (Reason.UNREADABLE, "not a regular file (a pipe, socket or device)")
    assert got["dog/link.jpg"].problem == (Reason.UNREADABLE, "broken symbolic link")


def test_fingerprint_sees_relabelling_and_rewrites(tmp_path):
    make_class_tree(tmp_path, per_class=2)
    first = sources.list_source(str(tmp_path), str(tmp_path)).fingerprint()
    assert sources.list_source(str(tmp_path), str(tmp_path)).fingerprint() == first
    # A move between class folders keeps size and mtime: only the path (label) changes.
    os.rename(tmp_path / "cat" / "img-0.jpeg", tmp_path / "dog" / "img-0-moved.jpeg")
    moved = sources.list_source(str(tmp_path), str(tmp_path)).fingerprint()
    assert moved != first
    write(tmp_path / "dog" / "img-1.jpeg", image_bytes(seed=99))
    assert sources.list_source(str(tmp_path), str(tmp_path)).fingerprint() != moved


def test_symlink_loops_are_not_followed_but_shared_folders_are(tmp_path):
    make_class_tree(tmp_path / "data", per_class=1)
    os.symlink(tmp_path / "data" / "cat", tmp_path / "data" / "cat" / "self")  # a loop
    os.symlink(tmp_path / "data", tmp_path / "data" / "dog" / "up")  # a loop through the root
    write(tmp_path / "pool" / "p.jpg", image_bytes(seed=9))
    os.makedirs(tmp_path / "data" / "bird")
    os.symlink(tmp_path / "pool", tmp_path / "data" / "bird" / "a")  # two links to one folder:
    os.symlink(tmp_path / "pool", tmp_path / "data" / "bird" / "b")  # both are listed
    listing = sources.list_source(str(tmp_path / "data"), str(tmp_path / "data"))
    assert sorted(_by_path(listing)) == ["bird/a/p.jpg", "bird/b/p.jpg", "cat/img-0.jpeg", "dog/img-0.jpeg"]


def test_undecodable_folder_names_still_give_a_label(tmp_path):
    root = os.fsencode(str(tmp_path))
    os.makedirs(root + b"/caf\xe9")
    with open(root + b"/caf\xe9/a.jpg", "wb") as f:
        f.write(image_bytes())
    write(tmp_path / "dog" / "b.jpg", image_bytes(seed=1))
    got = _by_path(sources.list_source(str(tmp_path), str(tmp_path)))
    assert got["caf\ufffd/a.jpg"].label == "caf\ufffd"
    assert got["caf\ufffd/a.jpg"].label.encode("utf-8")  # encodable: the Example can hold it


@pytest.mark.parametrize("names", [(b"cls\xff", b"cls\xfe"), (b"cat", b"cat ")])
def test_class_folders_that_would_merge_into_one_class_are_refused(tmp_path, names):
    """Undecodable bytes or a trailing space: two folders, one class name; they were merged without a word
    (NFC and NFD spellings of one name stay one class: test_labels_are_nfc_normalised)."""
    root = os.fsencode(str(tmp_path))
    for n, name in enumerate(names):
        os.makedirs(root + b"/" + name)
        with open(root + b"/" + name + b"/a.jpg", "wb") as f:
            f.write(image_bytes(seed=n))
    write(tmp_path / "dog" / "b.jpg", image_bytes(seed=9))
    with pytest.raises(sources.DataError, match="would become one class .*; rename or merge them"):
        sources.list_source(str(tmp_path), str(tmp_path))


def test_presplit_data_needs_an_eval_folder(tmp_path):
    make_class_tree(tmp_path / "train", per_class=2)
    make_class_tree(tmp_path / "test", per_class=1, seed=1)
    with pytest.raises(sources.DataError, match="the pre-split data has no eval/ folder"):
        sources.check_usable(sources.list_source(str(tmp_path), str(tmp_path)))


def test_unreadable_manifest_is_a_data_error(tmp_path):
    manifest = write(tmp_path / "m.csv", b'path,label\n"a.jpg\x00,cat\n')
    with pytest.raises(sources.DataError, match="not a readable CSV"):
        sources.list_source(str(tmp_path), manifest)
