"""`fedjax_het.data.download` against a local HTTP server (127.0.0.1, a thread) and tiny fixtures.

Each fixture is the official format in miniature (an SVHN-style `.mat`, a
CIFAR-style `tar.gz` of pickles, USPS-style LIBSVM `bz2`, MNIST-style IDX,
an image-folder zip); no test reaches the network.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import http.server
import io
import json
import pickle
import socket
import tarfile
import threading
import zipfile

import numpy as np
import pytest
from PIL import Image
from scipy import io as scipy_io

from fedjax_het import data
from fedjax_het.data import download as dl
from fedjax_het.data import npz
from fedjax_het.data._imageops import to_rgb32


class _Server:
  """Serves {path: bytes} with HTTP Range support; `cut[path]` truncates the first response."""

  def __init__(self):
    self.files: dict[str, bytes] = {}
    self.cut: dict[str, int] = {}
    self.stall = threading.Event()  # set: every request waits (until released) before answering
    self.requests: list[tuple[str, str | None]] = []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        server.requests.append((self.path, self.headers.get("Range")))
        if server.stall.is_set():
          server.release.wait(5)
        body = server.files.get(self.path)
        if body is None:
          self.send_error(404)
          return
        start = 0
        if self.headers.get("Range"):
          start = int(self.headers["Range"].split("=")[1].split("-")[0])
          if start >= len(body):
            self.send_error(416)
            return
          self.send_response(206)
          self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
          self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        limit = server.cut.pop(self.path, None)
        self.wfile.write(body[start:] if limit is None else body[start:limit])
        if limit is not None:
          self.wfile.flush()
          self.close_connection = True

      def log_message(self, *args):
        pass

    self.release = threading.Event()
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                   daemon=True)
    self.thread.start()

  def url(self, path: str) -> str:
    return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

  def close(self):
    self.release.set()
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def server():
  s = _Server()
  yield s
  s.close()


def _md5(body: bytes) -> str:
  return hashlib.md5(body).hexdigest()


def _serve(server, monkeypatch, name: str, bodies: dict[str, bytes]) -> None:
  """Points DATASETS[name] at `server`, which serves `bodies` (official file name -> bytes)."""
  for filename, body in bodies.items():
    server.files[f"/{name}/{filename}"] = body
  dataset = dl.DATASETS[name]
  files = tuple(dataclasses.replace(f, urls=(server.url(f"/{name}/{f.filename}"),),
                                    md5=_md5(bodies[f.filename])) for f in dataset.files)
  monkeypatch.setitem(dl.DATASETS, name, dataclasses.replace(dataset, files=files))


# ----------------------------------------------------------------------------- fixtures

_RNG = np.random.default_rng(7)


def _svhn_mat(n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
  images = _RNG.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  labels = np.arange(n) % 10  # 0 is stored as 10, as in SVHN
  buffer = io.BytesIO()
  scipy_io.savemat(buffer, {"X": np.transpose(images, (1, 2, 3, 0)),
                            "y": np.where(labels == 0, 10, labels).reshape(-1, 1).astype(np.float64)})
  return buffer.getvalue(), images, labels


def _usps_bz2(n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
  pixels = _RNG.integers(0, 256, (n, 256)).astype(np.float64)
  values = pixels / 255.0 * 2.0 - 1.0
  labels = np.arange(n) % 10
  lines = [f"{y + 1} " + " ".join(f"{i + 1}:{float(v)!r}" for i, v in enumerate(row))
           for y, row in zip(labels, values)]
  # torchvision's conversion, in float32.
  expected = ((values.astype(np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(n, 16, 16)
  return bz2.compress(("\n".join(lines) + "\n").encode()), expected, labels


def _cifar100_tgz() -> tuple[bytes, dict[str, np.ndarray]]:
  train_x = _RNG.integers(0, 256, (6, 3072), dtype=np.uint8)
  test_x = _RNG.integers(0, 256, (3, 3072), dtype=np.uint8)
  train_y, test_y = [0, 1, 2, 0, 1, 2], [2, 1, 0]
  members = {
      "cifar-100-python/train": {b"data": train_x, b"fine_labels": train_y},
      "cifar-100-python/test": {b"data": test_x, b"fine_labels": test_y},
      "cifar-100-python/meta": {b"fine_label_names": [b"apple", b"aquarium_fish", b"baby"]},
  }
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for name, content in members.items():
      body = pickle.dumps(content, protocol=2)
      info = tarfile.TarInfo(name)
      info.size = len(body)
      tar.addfile(info, io.BytesIO(body))
  expected = {"train_x": train_x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1),
              "test_x": test_x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1),
              "train_y": np.asarray(train_y), "test_y": np.asarray(test_y)}
  return buffer.getvalue(), expected


def _png(image: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


def _tinyimagenet_zip() -> tuple[bytes, dict[str, np.ndarray]]:
  wnids = ["n01443537", "n01629819"]
  train = _RNG.integers(0, 256, (2, 2, 64, 64, 3), dtype=np.uint8)  # (class, index, ...)
  val = _RNG.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as archive:
    root = "tiny-imagenet-200/"
    archive.writestr(root + "wnids.txt", "\n".join(wnids) + "\n")
    for c, wnid in enumerate(wnids):
      for i in range(2):
        archive.writestr(f"{root}train/{wnid}/images/{wnid}_{i}.png", _png(train[c, i]))
    archive.writestr(root + "val/val_annotations.txt",
                     f"val_0.png\t{wnids[1]}\t0\t0\t63\t63\nval_1.png\t{wnids[0]}\t0\t0\t63\t63\n")
    for i in range(2):
      archive.writestr(f"{root}val/images/val_{i}.png", _png(val[i]))
  return buffer.getvalue(), {"train_x": train.reshape(4, 64, 64, 3), "train_y": np.asarray(
      [0, 0, 1, 1]), "val_x": val, "val_y": np.asarray([1, 0])}


def _idx(array: np.ndarray) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
  return gzip.compress(header + array.astype(np.uint8).tobytes())


def _digit_folders(archive: zipfile.ZipFile, prefix: str, images: np.ndarray) -> None:
  for i, image in enumerate(images):
    archive.writestr(f"{prefix}/{i % 10}/{i:03d}.png", _png(image))


# ----------------------------------------------------------------------------- tests


def test_download_and_convert_usps_svhn_cifar100_tinyimagenet(server, monkeypatch, tmp_path):
  usps_train, usps_train_x, usps_train_y = _usps_bz2(12)
  usps_test, _, usps_test_y = _usps_bz2(5)
  svhn_train, svhn_train_x, svhn_train_y = _svhn_mat(20)
  svhn_test, svhn_test_x, svhn_test_y = _svhn_mat(10)
  cifar, cifar_expected = _cifar100_tgz()
  tiny, tiny_expected = _tinyimagenet_zip()
  _serve(server, monkeypatch, "usps", {"usps.bz2": usps_train, "usps.t.bz2": usps_test})
  _serve(server, monkeypatch, "svhn", {"train_32x32.mat": svhn_train,
                                       "test_32x32.mat": svhn_test})
  _serve(server, monkeypatch, "cifar100", {"cifar-100-python.tar.gz": cifar})
  _serve(server, monkeypatch, "tinyimagenet", {"tiny-imagenet-200.zip": tiny})
  for name in ("usps", "svhn", "cifar100", "tinyimagenet"):
    dl.download(name, tmp_path, progress=False)

  digits = npz.load_npz_digits(tmp_path)
  assert set(digits) == {"usps", "svhn"}
  np.testing.assert_array_equal(digits["usps"][0].images, to_rgb32(usps_train_x))
  np.testing.assert_array_equal(digits["usps"][0].labels, usps_train_y)
  np.testing.assert_array_equal(digits["usps"][1].labels, usps_test_y)
  np.testing.assert_array_equal(digits["svhn"][0].images, svhn_train_x)
  np.testing.assert_array_equal(digits["svhn"][0].labels, svhn_train_y)
  np.testing.assert_array_equal(digits["svhn"][1].images, svhn_test_x)
  np.testing.assert_array_equal(digits["svhn"][1].labels, svhn_test_y)

  train, test = npz.load_cifar100_glfc(tmp_path)
  np.testing.assert_array_equal(train.images, cifar_expected["train_x"])
  np.testing.assert_array_equal(train.labels, cifar_expected["train_y"])
  np.testing.assert_array_equal(test.images, cifar_expected["test_x"])
  np.testing.assert_array_equal(test.labels, cifar_expected["test_y"])
  np.testing.assert_array_equal(npz.load_public("cifar100", tmp_path), cifar_expected["train_x"])

  with np.load(tmp_path / "tinyimagenet.npz") as tiny_npz:
    for key, value in tiny_expected.items():
      np.testing.assert_array_equal(tiny_npz[key], value)
    assert list(tiny_npz["wnids"]) == ["n01443537", "n01629819"]
  public = npz.load_public("tinyimagenet", tmp_path)
  np.testing.assert_array_equal(public, to_rgb32(tiny_expected["train_x"]))

  manifest = json.loads((tmp_path / dl.MANIFEST).read_text())["datasets"]
  assert manifest["svhn"]["sources"][0]["md5"] == _md5(svhn_train)
  assert manifest["svhn"]["sources"][0]["url"].endswith("/svhn/train_32x32.mat")
  assert manifest["cifar100"]["outputs"]["cifar100_glfc.npz"]["arrays"]["train_x"] == [6, 32, 32, 3]
  assert dl.status(tmp_path)["svhn"].startswith("downloaded 20")
  assert dl.status(tmp_path)["mnist"] == "missing"
  assert not list(tmp_path.glob("**/*.part")) and not list(tmp_path.glob(".*tmp"))


def test_cli_downloads_mnist_and_fmnist_and_lists_them(server, monkeypatch, tmp_path, capsys):
  train = _RNG.integers(0, 256, (10, 28, 28), dtype=np.uint8)
  test = _RNG.integers(0, 256, (4, 28, 28), dtype=np.uint8)
  bodies = dict(zip(dl._IDX_NAMES, (_idx(train), _idx(np.arange(10)), _idx(test),
                                    _idx(np.arange(4)))))
  _serve(server, monkeypatch, "mnist", bodies)
  fashion = _RNG.integers(0, 256, (12, 28, 28), dtype=np.uint8)
  fashion_labels = np.asarray([0, 1, 2] * 4)
  _serve(server, monkeypatch, "fmnist", {**bodies, dl._IDX_NAMES[0]: _idx(fashion),
                                         dl._IDX_NAMES[1]: _idx(fashion_labels)})
  assert dl.main(["mnist", "fmnist", "--data_dir", str(tmp_path)]) == 0
  (mnist_train, mnist_test), = npz.load_npz_digits(tmp_path).values()
  np.testing.assert_array_equal(mnist_train.images, to_rgb32(train))
  np.testing.assert_array_equal(mnist_test.labels, np.arange(4))
  np.testing.assert_array_equal(npz.load_public("fmnist", tmp_path), to_rgb32(fashion))
  # The full official split too, read by load_dataset("fashion_mnist") (test files: MNIST's).
  fashion_train, fashion_test, provenance = data.load_dataset("fashion_mnist", data_dir=tmp_path)
  assert provenance == f"npz:{tmp_path / 'fmnist.npz'}"
  np.testing.assert_array_equal(fashion_train.images, to_rgb32(fashion))
  np.testing.assert_array_equal(fashion_train.labels, fashion_labels)
  np.testing.assert_array_equal(fashion_test.images, to_rgb32(test))
  with np.load(tmp_path / "fmnist.npz") as fmnist:
    assert fmnist["classes"][0] == "T-shirt/top" and len(fmnist["classes"]) == 10
  assert (tmp_path / "downloads" / "mnist" / "train-images-idx3-ubyte.gz").is_file()
  capsys.readouterr()
  assert dl.main(["--list", "--data_dir", str(tmp_path)]) == 0
  rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
  assert "downloaded" in rows["mnist"] and "downloaded" in rows["fmnist"]
  (tmp_path / "fmnist.npz").unlink()  # the public set alone: a partial Fashion-MNIST
  assert dl.status(tmp_path)["fmnist"] == "partial"
  assert "missing" in rows["svhn"]
  assert "--from PATH" in rows["office_home"] and "Venkateswara" in rows["office_home"]


def test_resume_after_a_cut_connection(server, monkeypatch, tmp_path):
  body, images, _ = _svhn_mat(40)
  _serve(server, monkeypatch, "svhn_extra", {"extra_32x32.mat": body})
  server.cut["/svhn_extra/extra_32x32.mat"] = len(body) // 3
  dl.download("svhn_extra", tmp_path, progress=False)
  assert server.requests == [("/svhn_extra/extra_32x32.mat", None),
                             ("/svhn_extra/extra_32x32.mat", f"bytes={len(body) // 3}-")]
  with np.load(tmp_path / "svhn_extra.npz") as extra:
    np.testing.assert_array_equal(extra["x"], images)
  assert (tmp_path / "downloads" / "svhn_extra" / "extra_32x32.mat").read_bytes() == body


def test_resume_from_the_partial_file_of_an_interrupted_run(server, monkeypatch, tmp_path):
  body, images, _ = _svhn_mat(30)
  _serve(server, monkeypatch, "svhn_extra", {"extra_32x32.mat": body})
  raw = tmp_path / "downloads" / "svhn_extra"
  raw.mkdir(parents=True)
  (raw / "extra_32x32.mat.part").write_bytes(body[:1000])
  dl.download("svhn_extra", tmp_path, progress=False)
  assert server.requests == [("/svhn_extra/extra_32x32.mat", "bytes=1000-")]
  with np.load(tmp_path / "svhn_extra.npz") as extra:
    np.testing.assert_array_equal(extra["x"], images)


def test_checksum_mismatch_leaves_nothing_behind(server, monkeypatch, tmp_path, capsys):
  body, _, _ = _svhn_mat(5)
  _serve(server, monkeypatch, "svhn_extra", {"extra_32x32.mat": body})
  server.files["/svhn_extra/extra_32x32.mat"] = body[:-10] + b"0123456789"  # corrupted
  with pytest.raises(dl.DownloadError, match=r"checksum mismatch for http://127\.0\.0\.1:\d+/"
                     r"svhn_extra/extra_32x32\.mat.*--from"):
    dl.download("svhn_extra", tmp_path, progress=False)
  assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []
  assert dl.main(["svhn_extra", "--data_dir", str(tmp_path)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: checksum mismatch")


def test_a_refused_connection_names_the_url_and_the_manual_alternative(monkeypatch, tmp_path,
                                                                       capsys):
  with socket.socket() as sock:  # a port nobody listens on
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  dataset = dl.DATASETS["cifar10"]
  url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
  monkeypatch.setitem(dl.DATASETS, "cifar10", dataclasses.replace(
      dataset, files=(dataclasses.replace(dataset.files[0], urls=(url,)),)))
  assert dl.main(["cifar10", "--data_dir", str(tmp_path), "--timeout", "5"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert f"cannot download {url}" in err and "refused" in err.lower()
  assert "python -m fedjax_het.data.download cifar10 --from" in err
  assert not (tmp_path / "cifar10.npz").exists()


def test_a_silent_server_times_out_with_one_line(server, monkeypatch, tmp_path):
  body, _, _ = _svhn_mat(5)
  _serve(server, monkeypatch, "svhn_extra", {"extra_32x32.mat": body})
  server.stall.set()
  with pytest.raises(dl.DownloadError, match=r"^cannot download http://127\.0\.0\.1:\d+/"
                     r"svhn_extra/extra_32x32\.mat: no data for 0\.3 s \(timeout\)\. Without "
                     r"network: .* --from <file or folder>\.$"):
    dl.download("svhn_extra", tmp_path, timeout=0.3, progress=False)
  assert not (tmp_path / "svhn_extra.npz").exists()


def test_from_converts_syn_into_digits_for_the_scenario(monkeypatch, tmp_path):
  usps_train, _, _ = _usps_bz2(200)
  usps_test, _, _ = _usps_bz2(20)
  official = tmp_path / "usps_files"
  official.mkdir()
  (official / "usps.bz2").write_bytes(usps_train)
  (official / "usps.t.bz2").write_bytes(usps_test)
  dataset = dl.DATASETS["usps"]
  monkeypatch.setitem(dl.DATASETS, "usps", dataclasses.replace(dataset, files=tuple(
      dataclasses.replace(f, md5=_md5((official / f.filename).read_bytes()))
      for f in dataset.files)))
  bundle = tmp_path / "bundle"
  dl.download("usps", bundle, from_path=official)  # official files given by hand

  syn_train = _RNG.integers(0, 256, (30, 32, 32, 3), dtype=np.uint8)
  syn_test = _RNG.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
  archive = tmp_path / "synthetic-digits.zip"  # the Kaggle archive's layout
  with zipfile.ZipFile(archive, "w") as z:
    _digit_folders(z, "synthetic_digits/imgs_train", syn_train)
    _digit_folders(z, "synthetic_digits/imgs_valid", syn_test)
  assert dl.main(["syn", "--from", str(archive), "--data_dir", str(bundle)]) == 0

  digits = npz.load_npz_digits(bundle)
  assert set(digits) == {"usps", "syn"}
  order = np.argsort(np.arange(30) % 10, kind="stable")  # ImageFolder: by class, then by path
  np.testing.assert_array_equal(digits["syn"][0].images, syn_train[order])
  np.testing.assert_array_equal(digits["syn"][0].labels, np.sort(np.arange(30) % 10))
  assert len(digits["syn"][1]) == 20 and len(digits["usps"][0]) == 200
  scenario = data.build_scenario(
      "digits", data_dir=bundle, sources={"usps": "real", "syn": "real"},
      domains=("usps", "syn"), private_sizes={"usps": 20, "syn": 10}, public_size=0)
  assert scenario.substituted == ()
  assert scenario.sources["syn"] == f"npz:{bundle / 'digits.npz'}[syn]"
  assert json.loads((bundle / dl.MANIFEST).read_text())["datasets"]["syn"]["sources"][0][
      "from"] == str(archive)
  assert not list(bundle.glob(".download-*"))


def test_from_office_folders_and_archives_and_checked_official_files(monkeypatch, tmp_path):
  classes = [f"class_{i:02d}" for i in range(10)]
  bundle = tmp_path / "bundle"
  bundle.mkdir()
  amazon = _RNG.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
  np.savez(bundle / "office_caltech10.npz", amazon_x=amazon, amazon_y=np.arange(10),
           classes=np.asarray(classes), missing_domains=np.asarray(["caltech"]),
           meta=np.asarray('{"domains_missing": ["caltech"]}'))
  caltech = _RNG.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
  folder = tmp_path / "office_caltech_10" / "caltech"
  for i, image in enumerate(caltech):
    (folder / classes[i % 10]).mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(folder / classes[i % 10] / f"{i:02d}.png")
  dl.download("office_caltech", bundle, from_path=tmp_path / "office_caltech_10")
  domains, names = npz.load_office_domains("office_caltech", bundle)
  assert set(domains) == {"amazon", "caltech"} and list(names) == classes
  np.testing.assert_array_equal(domains["amazon"].images, amazon)
  np.testing.assert_array_equal(domains["caltech"].labels, np.sort(np.arange(20) % 10))
  with np.load(bundle / "office_caltech10.npz") as merged:
    assert "missing_domains" not in merged.files and "meta" not in merged.files

  # Office-31 as its tar.gz lays it out: <domain>/images/<class>/*.jpg.
  office31 = _RNG.integers(0, 256, (3, 31, 32, 32, 3), dtype=np.uint8)
  archive = tmp_path / "domain_adaptation_images.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    for d, domain in enumerate(("amazon", "dslr", "webcam")):
      for c in range(31):
        body = _png(office31[d, c])
        info = tarfile.TarInfo(f"{domain}/images/object_{c:02d}/frame_0001.png")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
  dl.download("office31", bundle, from_path=archive)
  office = npz.load_office31(bundle)
  _, names = npz.load_office_domains("office31", bundle)
  assert names == tuple(f"object_{c:02d}" for c in range(31))
  np.testing.assert_array_equal(office["dslr"][0].images, office31[1, np.arange(31) % 10 <= 7])
  np.testing.assert_array_equal(office["webcam"][1].labels, np.flatnonzero(np.arange(31) % 10 > 7))

  with pytest.raises(data.DataUnavailableError, match=r"hemanthdv.*--from PATH"):
    dl.download("office_home", bundle)
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "tiny-imagenet-200.zip").write_bytes(b"not the official archive")
  with pytest.raises(data.DataError, match=r"md5 .* expected 90528d7ca1a48142e341f4ef8d21d0de "
                     r"\(published in ContinualAI/avalanche"):
    dl.download("tinyimagenet", bundle, from_path=bad)
  assert not (bundle / "tinyimagenet.npz").exists()


def _py2_cifar_pickle(array: np.ndarray, labels: list[int]) -> bytes:
  """A protocol-2 pickle as Python 2 and NumPy 1 wrote CIFAR's batches: py2 `str` (BINSTRING)
  array bytes, numpy.core.multiarray._reconstruct and a dtype built from py2 strings."""

  def short(text: bytes) -> bytes:  # SHORT_BINSTRING
    return b"U" + bytes([len(text)]) + text

  raw = array.tobytes()
  rows, cols = array.shape
  return (b"\x80\x02}(" + short(b"data")
          + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + short(b"b")
          + b"\x87R(K\x01K" + bytes([rows]) + b"M" + cols.to_bytes(2, "little") + b"\x86"
          + b"cnumpy\ndtype\n" + short(b"u1") + b"K\x00K\x01\x87R(K\x03" + short(b"|")
          + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89"
          + b"T" + len(raw).to_bytes(4, "little") + raw + b"tb"
          + short(b"labels") + b"](" + b"".join(b"K" + bytes([y]) for y in labels) + b"eu.")


def test_cifar_batches_in_the_python2_format_load_and_other_objects_are_refused():
  array = (np.arange(2 * 3072) % 251).astype(np.uint8).reshape(2, 3072)
  batch = dl.read_cifar_batch(_py2_cifar_pickle(array, [3, 7]), "data_batch_1")
  assert batch["labels"] == [3, 7]
  np.testing.assert_array_equal(batch["data"], array)
  evil = pickle.dumps({"data": 0}, protocol=2).replace(b"}", b"cos\nsystem\n(U\x04trueR}", 1)
  with pytest.raises(data.DataError, match=r"data_batch_2: not a CIFAR python batch: "
                     r"unexpected object os\.system"):
    dl.read_cifar_batch(evil, "data_batch_2")


@pytest.mark.parametrize("filters", [True, False])
def test_from_refuses_an_archive_that_writes_outside_its_folder(tmp_path, monkeypatch, filters):
  if not filters:  # as on Python < 3.11.4
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
  archive = tmp_path / "office.tar"
  with tarfile.open(archive, "w") as tar:
    info = tarfile.TarInfo("../escaped.txt")
    info.size = 2
    tar.addfile(info, io.BytesIO(b"hi"))
  with pytest.raises(data.DataError, match=r"--from .*office\.tar: (cannot be unpacked|unsafe "
                     r"archive member '\.\./escaped\.txt')"):
    dl.download("office31", tmp_path / "bundle", from_path=archive)
  assert not (tmp_path / "bundle" / "escaped.txt").exists() and not (tmp_path /
                                                                     "escaped.txt").exists()


def test_the_offline_message_names_every_file_the_dataset_needs(monkeypatch, tmp_path, capsys):
  # MNIST is four files: a failed download names all four and one folder for --from.
  dataset = dl.DATASETS["mnist"]
  dead = "http://127.0.0.1:9/"  # the discard port: the connection is refused
  monkeypatch.setitem(dl.DATASETS, "mnist", dataclasses.replace(dataset, files=tuple(
      dataclasses.replace(f, urls=(dead + f.filename,)) for f in dataset.files)))
  assert dl.main(["mnist", "--data_dir", str(tmp_path), "--timeout", "2"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert len(dataset.files) == 4
  assert "download its 4 files by hand" in err
  for remote in dataset.files:
    assert dead + remote.filename in err
  assert "python -m fedjax_het.data.download mnist --from <that folder>" in err
