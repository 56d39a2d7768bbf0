"""The review loop: `imagepipe review`'s page on a run with planted label flips, driven from the keyboard in headless
Chromium; its decisions file; and the next run with --review trained on them. Then the review file's and the
server's guarantees on their own (whole lines, the last decision counts, one server a file, token, host, files)."""

import csv
import glob
import json
import os
import signal
import urllib.error
import urllib.request

import pytest
from example_gen_helpers import by_filename, read_examples

from storage import review_file
from storage.errors import ConfigError

ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")


@pytest.fixture(scope="module")
def flipped_run(label_flip_runs):
    """The 300 small digits with 15 labels flipped (seeded), run with the label check on, warn only (tests/conftest.py
    label_flip_runs, which the data health test shares). The next runs' settings, but --label-check off: they test
    the review's decisions, and each new ingestion would train the check's 3-fold cnn again."""
    root, warned = label_flip_runs["root"], label_flip_runs["warned"]
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert f"on a page, for the next run's --review: imagepipe review --root {root}" in warned.stdout  # the hint
    args = list(label_flip_runs["args"])
    args[args.index("--label-check") + 1] = "off"
    return root, label_flip_runs["data"], args


def _serve(*args):
    from commands import StartedCommand

    server = StartedCommand(["review", *args])
    lines = server.lines(timeout=120)
    listed, opened = next(lines), next(lines)
    return server, listed.strip(), opened.split()[1]


@pytest.mark.slow
def test_a_review_from_the_keyboard_is_kept_and_the_next_run_trains_on_it(flipped_run):
    from browser import drive_page
    from commands import run_imagepipe

    root, data, args = flipped_run
    server, listed, url = _serve("--root", root)
    try:
        assert listed.startswith("review of run ") and "label suspects" in listed
        review_path = listed.rsplit("decisions appended to ", 1)[1].strip()
        progress = "document.getElementById('progress').textContent"
        seen = drive_page(
            url,
            [
                ("wait", "document.body.dataset.ready"),
                ("key", "r"),
                ("key", "Enter"),
                ("wait", f"{progress}.startsWith('1 of')"),  # relabel: the suggestion
                ("key", "s"),
                ("wait", f"{progress}.startsWith('2 of')"),  # take the suggestion at once
                ("key", "x"),
                ("wait", f"{progress}.startsWith('3 of')"),  # exclude
                ("wait", "![...document.querySelectorAll('.decision')].some(b => b.textContent.startsWith('saving'))"),
            ],
            "({progress: " + progress + ", badges: [...document.querySelectorAll('.decision')].slice(0, 3)"
            ".map(b => b.textContent), paths: [...document.querySelectorAll('.path')].slice(0, 3)"
            ".map(p => p.textContent), images: [...document.querySelectorAll('img')].slice(0, 3)"
            ".map(i => i.complete && i.naturalWidth > 0)})",
            os.path.join(ARTIFACTS, "review-page.png"),
        )
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    assert server.returncode == 0
    assert seen["errors"] == [], seen["errors"]
    check = seen["check"]
    assert check["progress"].startswith("3 of ") and check["progress"].endswith(" reviewed")
    assert check["badges"][0].startswith("relabelled to ") and check["badges"][1].startswith("relabelled to ")
    assert check["badges"][2] == "excluded" and all(check["images"])
    with open(review_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["action"] for r in rows] == ["relabel", "relabel", "exclude"]
    assert [r["path"] for r in rows] == check["paths"]
    suspects = list(
        csv.DictReader(
            open(
                glob.glob(os.path.join(root, "pipelines", "*", "DataHealth", "health", "*", "label_issues.csv"))[0],
                newline="",
            )
        )
    )
    suggested = {s["path"]: s["suggested"] for s in suspects}
    assert all(r["new_label"] == suggested[r["path"]] and len(r["key"]) == 64 for r in rows[:2])

    # Reopened: what was decided is shown.
    again, _, url = _serve("--root", root, "--review-file", review_path)
    try:
        reopened = drive_page(
            url,
            [("wait", "document.body.dataset.ready")],
            progress,
            os.path.join(ARTIFACTS, "review-page-reopened.png"),
        )
    finally:
        again.send_signal(signal.SIGINT)
        again.wait(timeout=60)
    assert reopened["check"].startswith("3 of ")

    second = run_imagepipe(*args, "--review", review_path)
    assert second.returncode == 0, second.stderr[-3000:]
    line = next(x for x in second.stdout.splitlines() if x.strip().startswith("ImageExampleGen") and "ran" in x)
    assert f"review {review_path}: 2 relabelled, 1 excluded" in line, line
    report_dirs = sorted(
        glob.glob(os.path.join(root, "pipelines", "*", "ImageExampleGen", "report", "*")),
        key=lambda p: int(os.path.basename(p)),
    )
    quarantine = list(csv.DictReader(open(os.path.join(report_dirs[-1], "quarantine.csv"), newline="")))
    assert [(q["path"], q["reason"]) for q in quarantine] == [(rows[2]["path"], "excluded_by_review")]
    examples_dirs = sorted(
        glob.glob(os.path.join(root, "pipelines", "*", "ImageExampleGen", "examples", "*")),
        key=lambda p: int(os.path.basename(p)),
    )
    written = by_filename(read_examples(examples_dirs[-1]))
    for row in rows[:2]:
        assert written[row["path"]]["image/class/text"].decode() == row["new_label"]
    assert rows[2]["path"] not in written
    summary = json.load(open(os.path.join(report_dirs[-1], "summary.json")))
    assert summary["review"]["not_applied"] == [] and summary["examples_written"] == 299

    # One more decision: a new ingestion (the decisions are part of its fingerprint), not the cached one.
    extra = next(s for s in suspects if s["path"] not in {r["path"] for r in rows})
    log = review_file.Log(review_path)
    log.append(
        review_file.Decision(review_file.now(), extra["key"], extra["path"], "exclude", extra["given"], "", "test")
    )
    log.close()
    third = run_imagepipe(*args, "--review", review_path)
    assert third.returncode == 0, third.stderr[-3000:]
    line = next(x for x in third.stdout.splitlines() if x.strip().startswith("ImageExampleGen"))
    assert " ran " in line and "2 relabelled, 2 excluded" in line, line


def test_the_review_file_keeps_whole_lines_and_the_last_decision(tmp_path):
    path = str(tmp_path / "review_file.csv")
    log = review_file.Log(path)
    log.append(review_file.Decision("t1", "a" * 64, "cat/1.jpg", "relabel", "cat", "dog", "likely label error"))
    log.append(review_file.Decision("t2", "b" * 64, 'odd, "name".jpg', "exclude", "cat", "", "outlier"))
    log.append(review_file.Decision("t3", "a" * 64, "cat/1.jpg", "keep", "cat", "", "likely label error"))
    with pytest.raises(ConfigError, match="another `imagepipe review` is serving this file"):
        review_file.Log(path)
    log.close()
    with open(path, "a") as f:
        f.write("t4," + "c" * 64 + ",cat/3.jpg,excl")  # a machine that stopped mid-line
    found = review_file.read(path)
    assert {k[0]: d.action for k, d in found.items()} == {"a": "keep", "b": "exclude"}  # the cut line: never read
    assert found["b" * 64].path == 'odd, "name".jpg'
    assert set(review_file.changes(found)) == {"b" * 64}
    review_file.Log(path).close()  # reopened: the cut line is dropped, the next one starts clean
    with open(path, "a") as f:
        f.write("t5," + "d" * 64 + ",cat/4.jpg,exclude,cat,,saved by an editor")  # whole, without its newline
    assert review_file.read(path)["d" * 64].action == "exclude"
    review_file.Log(path).close()  # ended with its newline, kept
    assert open(path).read().endswith("saved by an editor\n")
    assert "cat/3.jpg" not in open(path).read()
    user_file = tmp_path / "mine.csv"
    user_file.write_text("name,score\nx,1\n")
    with pytest.raises(ConfigError, match=r"mine\.csv: not a review file"):
        review_file.Log(str(user_file))
    assert user_file.read_text() == "name,score\nx,1\n"  # never appended to


def test_the_review_server_answers_only_its_token_and_host_and_serves_only_listed_files(tmp_path):
    import threading

    from review import items, server

    data = tmp_path / "data"
    (data / "cat").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (64, 48), (200, 10, 10)).save(data / "cat" / "1.jpg")
    (tmp_path / "secret.jpg").write_bytes((data / "cat" / "1.jpg").read_bytes())
    os.symlink(tmp_path / "secret.jpg", data / "cat" / "link.jpg")  # a link out of the data root
    found = items.Items(str(data))
    found.add(items.OUTLIER, "cat/1.jpg", "outlier: <b>very dark</b>", given="cat")
    found.add(items.OUTLIER, "cat/link.jpg", "outlier", given="cat")
    review = server.Review(found, ["cat", "dog"], review_file.Log(str(tmp_path / "r.csv")))
    page = server.serve(review)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    base, token = page.url.split("/?token=")

    def status(url, data=None, host=None):
        request = urllib.request.Request(url, data=data)
        if host:
            request.add_header("Host", host)
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    try:
        assert status(f"{base}/state")[0] == 403
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # one character off, never the token itself
        assert status(f"{base}/state?token={wrong}")[0] == 403
        assert status(f"{base}/state?token={token}", host="evil.example:80")[0] == 403  # DNS rebinding
        code, body = status(f"{base}/state?token={token}")
        assert code == 200 and json.loads(body)["items"][0]["reasons"] == ["outlier: <b>very dark</b>"]
        assert "file" not in json.loads(body)["items"][0]  # where files are stays on the server
        assert status(f"{base}/image/0?token={token}")[0] == 200
        assert status(f"{base}/image/1?token={token}")[0] == 404  # resolves outside the data root
        assert (
            status(f"{base}/image/2?token={token}")[0] == 404 and status(f"{base}/image/..%2F?token={token}")[0] == 404
        )
        code, body = status(
            f"{base}/decide?token={token}", json.dumps({"item": 0, "action": "relabel", "new_label": "bird"}).encode()
        )
        assert code == 400 and b"not one of the run's classes" in body
        assert (
            status(
                f"{base}/decide?token={token}",
                json.dumps({"item": 0, "action": "relabel", "new_label": "dog"}).encode(),
            )[0]
            == 200
        )
        headers = urllib.request.urlopen(f"{base}/?token={token}").headers
        assert "default-src 'none'" in headers["Content-Security-Policy"]
    finally:
        page.shutdown()
        page.server_close()
        review.log.close()
    assert (
        review_file.read(str(tmp_path / "r.csv"))[list(review_file.read(str(tmp_path / "r.csv")))[0]].new_label == "dog"
    )


def test_a_compiled_job_takes_its_review_file_from_cloud_storage(tmp_path):
    from pipeline.cloud_config import CloudConfig
    from pipeline.config import PipelineConfig

    local = tmp_path / "review.csv"
    local.write_text(review_file.HEADER)
    config = PipelineConfig(data="gs://bucket/pets", review=str(local))
    with pytest.raises(ConfigError, match=r"--review .*review\.csv: a local file is not in the pipeline's containers"):
        CloudConfig(project="proj-1", pipeline_root="gs://bucket/root", image="gcr.io/p/i:1").validate(config)


def test_decisions_not_applied_are_listed_with_why_and_copies_count_as_files(tmp_path):
    """review_summary: a decision whose image is gone, was quarantined before it was read, or changed since, or
    whose new label is not a class, is listed and not applied; exact copies are files each; a relabel to the label
    the file already has changes nothing."""
    from components.example_gen import executor
    from images.finding.listing import Candidate, Listing

    path = str(tmp_path / "r.csv")
    log = review_file.Log(path)
    keys = {name: (name * 64)[:64] for name in "abcdef"}
    for name, rel, action, new in (
        ("a", "cat/1.jpg", "relabel", "dog"),
        ("b", "cat/2.jpg", "exclude", ""),
        ("c", "cat/gone.jpg", "exclude", ""),
        ("d", "cat/edited.jpg", "relabel", "dog"),
        ("e", "cat/broken.jpg", "exclude", ""),
        ("f", "cat/3.jpg", "relabel", "bird"),
    ):
        log.append(review_file.Decision("t", keys[name], rel, action, "cat", new, "why"))
    log.close()
    listing = Listing(
        "folders",
        "data",
        [
            Candidate(f"data/{p}", p, label, None)
            for p, label in (
                ("cat/1.jpg", "cat"),
                ("cat/2.jpg", "cat"),
                ("cat/2-copy.jpg", "cat"),
                ("cat/edited.jpg", "cat"),
                ("cat/broken.jpg", "cat"),
                ("cat/3.jpg", "cat"),
                ("dog/1.jpg", "dog"),
            )
        ],
    )
    review = executor.review_decisions(path, listing)
    assert [r["why"] for r in review["refused"]] == ["bird is not a class of this data"]
    reviewed = [[keys["a"], "relabel"], [keys["b"], "exclude"], [keys["b"], "exclude"]]  # cat/2.jpg and its copy
    bad = [{"path": "cat/broken.jpg", "reason": "corrupt"}, {"path": "cat/2.jpg", "reason": "excluded_by_review"}]
    summary = executor.review_summary(path, review, reviewed, listing, bad)
    assert (summary["relabelled"], summary["excluded"], summary["decisions"]) == (1, 2, 6)
    assert {r["path"]: r["why"] for r in summary["not_applied"]} == {
        "cat/3.jpg": "bird is not a class of this data",
        "cat/broken.jpg": "quarantined (corrupt)",
        "cat/edited.jpg": "changed since the review (its content hash differs)",
        "cat/gone.jpg": "not in this data",
    }


def test_a_multi_label_relabel_is_a_label_set_and_may_be_empty(tmp_path):
    from review import items, server

    found = items.Items(str(tmp_path))
    found.add(items.LABEL_SUSPECT, "a.jpg", "why", key="a" * 64, given="cat;dog")
    review = server.Review(found, ["cat", "dog", "person"], review_file.Log(str(tmp_path / "r.csv")), multi_label=True)
    assert review.decide(0, "relabel", "person;cat")["new_label"] == "cat;person"  # one spelling of a set
    assert review.decide(0, "relabel", "")["new_label"] == ""  # none of the labels
    with pytest.raises(ValueError, match="not one of the run's classes"):
        review.decide(0, "relabel", "cat;horse")
    review.log.close()
    assert review_file.read(str(tmp_path / "r.csv"))["a" * 64].new_label == ""


def test_a_bad_review_file_stops_the_run_in_one_line_before_ingestion(tmp_path, small_digits):
    from commands import run_imagepipe

    user_file = tmp_path / "notes.csv"
    user_file.write_text("name,score\nx,1\n")
    broken = tmp_path / "broken.csv"
    broken.write_text(review_file.HEADER + "t,abc,cat/1.jpg,rename,cat,dog,why\n")
    for given, expected in (
        (tmp_path / "missing.csv", "missing.csv: no such file"),
        (user_file, "notes.csv: not a review file"),
        (broken, "broken.csv: line 2 is not a decision"),
    ):
        done = run_imagepipe("run", "--root", str(tmp_path / "root"), "--data", small_digits, "--review", str(given))
        assert done.returncode == 2 and "ImageExampleGen" not in done.stdout, done.stdout
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("imagepipe: error: --review ") and expected in lines[0], lines
    assert user_file.read_text() == "name,score\nx,1\n"


def test_predict_s_unsure_images_are_listed_and_sure_ones_are_not(tmp_path):
    from prediction.result_files import json_record
    from review import items

    results = tmp_path / "results.jsonl"
    results.write_text(
        "\n".join(
            [
                json_record({"path": "/photos/a.jpg", "predictions": [("cat", 0.41), ("dog", 0.39)], "unsure": True}),
                json_record({"path": "/photos/b.jpg", "predictions": [("dog", 0.97), ("cat", 0.03)], "unsure": False}),
                json_record({"path": "/photos/c.jpg", "error": "not an image"}),
            ]
        )
        + "\n"
    )
    found = items.from_run({"components": []}, str(results))
    assert [(it["path"], it["file"], it["suggested"], it["kinds"]) for it in found.items] == [
        ("/photos/a.jpg", "/photos/a.jpg", "cat", [items.UNSURE])
    ]
    assert found.items[0]["reasons"] == ["unsure prediction: best cat at 0.41"]
    from prediction.result_files import csv_cells, csv_header

    table = tmp_path / "results.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(csv_header(2))
        writer.writerow(
            csv_cells({"path": "/photos/a.jpg", "predictions": [("cat", 0.41), ("dog", 0.39)], "unsure": True}, 2)
        )
        writer.writerow(csv_cells({"path": "/photos/b.jpg", "predictions": [("dog", 0.97)], "unsure": False}, 2))
    found = items.from_run({"components": []}, str(table))
    assert [(it["path"], it["suggested"], it["confidence"]) for it in found.items] == [("/photos/a.jpg", "cat", 0.41)]


# --- hardening, round 5: names, encodings and files that are not files ------------------------------------------


def test_review_file_cells_are_spreadsheet_safe_and_read_back_as_written(tmp_path):
    """A path or class an attacker names `=HYPERLINK(...)` is text in a spreadsheet, and the review loop reads back
    exactly what was decided (a leading apostrophe of a name's own too; U+2028 inside a path)."""
    from storage.spreadsheet import csv_text, read_rows

    path = str(tmp_path / "r.csv")
    decided = [
        review_file.Decision("t1", "a" * 64, '=HYPERLINK("http:evil","x").jpg', "relabel", "-1", "+2", "@SUM(1)"),
        review_file.Decision("t2", "b" * 64, "'quoted.jpg", "exclude", "'cat", "", "outlier"),
        review_file.Decision("t3", "c" * 64, "line\u2028separator.jpg", "keep", "cat", "", "why\u2028not"),
    ]
    log = review_file.Log(path)
    for decision in decided:
        log.append(decision)
    log.close()
    with open(path, newline="", encoding="utf-8") as f:
        cells = [cell for row in list(csv.reader(f))[1:] for cell in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@")], cells  # no cell a spreadsheet would run
    assert sorted(review_file.read(path).values()) == sorted(decided)
    # the health and near-duplicate lists are read back through the same module: a class named -1 is -1
    assert read_rows(csv_text(("path", "given"), [{"path": "-1/a.jpg", "given": "-1"}])) == [
        {"path": "-1/a.jpg", "given": "-1"}
    ]


def test_review_files_saved_by_spreadsheets_and_editors_are_read(tmp_path):
    row = "t1," + "a" * 64 + ",cat/1.jpg,relabel,cat,dog,why"
    excel = tmp_path / "excel.csv"
    excel.write_bytes(b"\xef\xbb\xbf" + (review_file.HEADER.strip() + "\r\n" + row + "\r\n").encode())
    assert review_file.read(str(excel))["a" * 64].new_label == "dog"
    log = review_file.Log(str(excel))  # appended to as it is
    log.append(review_file.Decision("t2", "b" * 64, "cat/2.jpg", "exclude", "cat", "", "why"))
    log.close()
    assert set(review_file.read(str(excel))) == {"a" * 64, "b" * 64}
    # Latin-1 bytes, then a last line cut short: reopened, exactly the cut bytes go, and the next decision is whole
    latin = tmp_path / "latin.csv"
    whole = ("t1," + "a" * 64 + ",caf").encode() + b"\xe9.jpg,exclude,cat,,why\n"
    latin.write_bytes(review_file.HEADER.encode() + whole + b"t2," + b"b" * 10)
    log = review_file.Log(str(latin))
    log.append(review_file.Decision("t3", "c" * 64, "cat/3.jpg", "exclude", "cat", "", "why"))
    log.close()
    assert latin.read_bytes().startswith(review_file.HEADER.encode() + whole + b"t3,")
    found = review_file.read(str(latin))
    assert set(found) == {"a" * 64, "c" * 64} and found["a" * 64].path == "caf\ufffd.jpg"


@pytest.mark.parametrize("option", [review_file.READ_OPTION, review_file.WRITE_OPTION])
def test_a_review_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, option):
    pipe = tmp_path / "pipe.csv"
    os.mkfifo(pipe)  # reading it would block for ever
    for given, said in ((pipe, "not a regular file"), ("/dev/zero", "not a regular file"), (tmp_path, "a folder")):
        with pytest.raises(ConfigError) as caught:
            review_file.read(str(given), option)
        message = str(caught.value)
        assert message.startswith(f"{option} {given}: {said}") and "\n" not in message, message
        assert ("or a new path" in message) == (option == review_file.WRITE_OPTION)  # `run --review` reads only
    from pipeline.config import PipelineConfig

    with pytest.raises(ConfigError, match="--review .*pipe.csv: not a regular file"):
        PipelineConfig(review=str(pipe)).validate()


def test_the_review_server_answers_malformed_requests_with_a_4xx(tmp_path):
    import threading

    from review import items, server

    assert server._number("\u00b2", 10) is None and server._number("9" * 5000, 10) is None
    assert server._number("3", 10) == 3 and server._number("10", 10) is None
    found = items.Items(str(tmp_path))
    found.add(items.OUTLIER, "cat/1.jpg", "outlier", given="cat")
    review = server.Review(found, ["cat", "dog"], review_file.Log(str(tmp_path / "r.csv")))
    page = server.serve(review)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    base, token = page.url.split("/?token=")

    def status(url, data=None):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data)) as answer:
                return answer.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert status(f"{base}/decide?token={token}", b"[" * 60000) == 400  # nested past the recursion limit
        assert status(f"{base}/image/{'9' * 5000}?token={token}") == 404
        assert status(f"{base}/image/%C2%B2?token={token}") == 404
        assert status(f"{base}/decide?token={token}", json.dumps({"item": "9" * 5000}).encode()) == 400
    finally:
        page.shutdown()
        page.server_close()
        review.log.close()


def test_review_s_own_inputs_are_checked_in_one_line(tmp_path, capsys):
    from cli.main import main as cli_main
    from review import items

    for argv, said in (
        (["--port", "99999"], "--port 99999: use 0 (any free port) or a port from 1 to 65535"),
        (["--review-file", str(tmp_path)], f"--review-file {tmp_path}: a folder"),
    ):
        assert cli_main(["review", "--root", str(tmp_path / "root"), *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], lines
    binary = tmp_path / "results.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    for given, said in (
        (tmp_path, "a folder"),
        (tmp_path / "none.jsonl", "no such file"),
        (binary, "not a predictions file (UnicodeDecodeError"),
    ):
        with pytest.raises(ConfigError) as caught:
            items.from_run({"components": []}, str(given))
        assert str(caught.value).startswith(f"--predictions {given}: {said}"), str(caught.value)
