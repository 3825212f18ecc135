"""`tracegym show` names each image of a trace by the run folder's file that holds it."""

from tracegym.cli.show import image_line, run
from tracegym.core.episode import Episode
from tracegym.core.image_ref import image_ref, stored_name
from tracegym.core.messages import ImagePart
from tracegym.eval.run_folder import RunFolder
from tracegym.testing.images import image_part, image_trace, png


def _folder(tmp_path):
    folder = RunFolder.create(tmp_path, "colours", "fake-model", run_id="run")
    folder.write_config({"taskset": {"id": "colours"}})
    folder.log.append(Episode.solo(image_trace()))
    folder.log.close()
    return folder


def test_show_prints_each_image_as_its_file_in_the_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the panel's lines whole
    folder = _folder(tmp_path)
    assert run([str(folder.path), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert f"[image images/{stored_name(image_ref(png()))}, " in out


def test_show_says_when_an_image_file_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    folder = _folder(tmp_path)
    for path in folder.images.folder.iterdir():
        path.unlink()
    assert run([str(folder.path), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 image(s) the traces name are missing" in out and "image missing: tracegym-image:sha256:" in out


def test_an_image_not_stored_is_named_by_what_it_is(tmp_path):
    assert image_line(image_part(png()), None).startswith("image: inline image/png, ")
    assert image_line(ImagePart(image_url={"url": "https://example.com/x.png"}), None) == \
        "image: https://example.com/x.png"
