"""
dev/techdocs.py on the CPU, offline: small fake .deb files (an ar archive holding data.tar.xz or
.gz, as Debian's) with a few documents each, built as a user would (--debs, then --text from the text it
assembled); its token files against the benchmark's own cut (make_corpus.py's loop, copied below), what it
leaves out, and its mistakes as one line that writes nothing. Also dev/speedrun.py's choice of corpus.
"""
import gzip
import importlib.util
import io
import os
import random
import sys
import tarfile

import numpy as np
import pytest
from conftest import ROOT, run

from gpt.data import find_dataset, open_tokens
from gpt.data.loader import make_loader
from gpt.data.tokenizer import gpt2_encoding
from gpt.runtime.errors import UserError

PREPARE = os.path.join(ROOT, "dev", "techdocs.py")
spec = importlib.util.spec_from_file_location("techdocs_prepare", PREPARE)
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)
sys.path.insert(0, os.path.join(ROOT, "dev"))
import speedrun  # noqa: E402

LINUX = "usr/share/doc/linux-doc-6.1/Documentation/"
PYTHON = "usr/share/doc/python3.11/html/_sources/"
PERL = "usr/share/perl/5.36.0/pod/"
LEFT_OUT = "LEFTOUT"  # in every file that must not reach the corpus


def prose(seed, chars):
    """Paragraphs of words, `chars` characters or a few more, the same for a seed."""
    rng = random.Random(seed)
    words = "the kernel module reads a buffer and returns its length to the caller; see os.path and perlfunc".split()
    paras, size = [], 0
    while size < chars:
        para = " ".join(rng.choice(words) for _ in range(rng.randint(20, 200)))
        paras.append(para)
        size += len(para) + 2
    return "\n\n".join(paras)


# (path inside the package, its bytes, the document the corpus holds or None when left out)
LINUX_FILES = [
    (LINUX + "admin-guide/intro.rst.gz", gzip.compress(prose(1, 700_000).encode()), prose(1, 700_000)),
    (LINUX + "small.txt", b"\xef\xbb\xbf\n\nTitle\r\n=====\r\nline ends\rof all kinds \xff\n\n  \n",
     "Title\n=====\nline ends\nof all kinds \ufffd"),
    (LINUX + "translations/zh_CN/index.rst.gz", gzip.compress(f"{LEFT_OUT} translation".encode()), None),
    (LINUX + "devicetree/bindings/foo.txt", f"{LEFT_OUT} binding".encode(), None),
    (LINUX + "devicetree/bindings/foo.yaml", f"{LEFT_OUT}: yaml".encode(), None),
    (LINUX + "images/logo.svg", f"<svg>{LEFT_OUT}</svg>".encode(), None),
    ("usr/share/doc/linux-doc-6.1/html/index.html", f"<p>{LEFT_OUT}</p>".encode(), None),
]
PYTHON_FILES = [
    (PYTHON + "library/os.rst.txt", prose(2, 400_000).encode(), prose(2, 400_000)),
    (PYTHON + "tutorial/index.rst.txt", b"A literal <|endoftext|> is text.\n", "A literal <|endoftext|> is text."),
    ("usr/share/doc/python3.11/html/library/os.html", f"<p>{LEFT_OUT}</p>".encode(), None),
]
PERL_FILES = [
    (PERL + "perlfunc.pod", prose(3, 350_000).encode(), prose(3, 350_000)),
    (PERL + "empty.pod", b"\n\n", None),  # nothing but blank lines: no document
    ("usr/share/man/man1/perlfunc.1.gz", gzip.compress(f"{LEFT_OUT} man".encode()), None),
]


def ar(members):
    """An ar archive (the .deb container) of [(name, bytes)]."""
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data + b"\n" * (len(data) % 2)
    return out


def deb(path, files, compression="xz", link=None):
    """A .deb holding files [(path, bytes, _)] as ./path (Debian's names), and a symbolic link if given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}", **({"preset": 0} if compression == "xz" else {})) as tar:
        for name, data, _ in files:
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo("./" + link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    with open(path, "wb") as f:
        f.write(ar([("debian-binary", b"2.0\n"), ("control.tar.xz", b""), (f"data.tar.{compression}", buf.getvalue())]))
    return str(path)


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("debs")
    deb(folder / "linux-doc-6.1_1.0_all.deb", LINUX_FILES, link=(LINUX + "Changes.gz", "admin-guide/intro.rst.gz"))
    deb(folder / "python3.11-doc_1.0_all.deb", PYTHON_FILES, compression="gz")
    deb(folder / "perl-doc_1.0_all.deb", PERL_FILES)
    return folder


def expected_text():
    docs = sorted((path, doc) for path, _, doc in LINUX_FILES + PYTHON_FILES + PERL_FILES if doc is not None)
    return "\n\n".join(doc for _, doc in docs)


def benchmark_tokens(text):
    """train and val as the benchmark's make_corpus.py writes them from this text (its loop, as written there)."""
    chunks, cur, size = [], [], 0
    for para in text.split('\n\n'):
        cur.append(para); size += len(para) + 2  # noqa: E702
        if size >= 65536:
            chunks.append('\n\n'.join(cur)); cur, size = [], 0  # noqa: E702
    if cur:
        chunks.append('\n\n'.join(cur))
    ids = gpt2_encoding().encode_ordinary_batch(chunks, num_threads=4)
    train = [x + [50256] for i, x in enumerate(ids) if i % 20 != 19]
    val = [x + [50256] for i, x in enumerate(ids) if i % 20 == 19]
    return [np.array([t for x in parts for t in x], dtype=np.uint16) for parts in (train, val)], chunks


@pytest.fixture(scope="module")
def built(debs, gpt2_ranks_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("techdocs") / "data"
    r = run(PREPARE, f"--debs={debs}", "--unpinned", f"--out_dir={out}")
    return out, r


def test_the_corpus_is_the_documents_cut_and_tokenized_as_the_benchmarks(built):
    out, r = built
    text = expected_text()
    with gzip.open(out / "techdocs.txt.gz", "rb") as f:
        assert f.read().decode("utf-8") == text
    assert (out / "techdocs.txt.gz").read_bytes()[4:8] == bytes(4)  # no time stamp: the same bytes every run
    assert LEFT_OUT not in text
    (train, val), chunks = benchmark_tokens(text)
    assert len(chunks) == 23 and len(val) > 1025  # one val chunk, and it holds a window of the benchmark's context
    data_dir, meta, _ = find_dataset("techdocs", str(out))
    assert meta == {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256}
    got_train, got_val = (np.asarray(open_tokens(str(out / f"{s}.bin"))) for s in ("train", "val"))
    np.testing.assert_array_equal(got_train, train)
    np.testing.assert_array_equal(got_val, val)
    # one <|endoftext|> after each chunk (the literal one in a document is text), val the 20th chunk
    assert (got_train == 50256).sum() == 22 and (got_val == 50256).sum() == 1 and got_val[-1] == 50256
    assert gpt2_encoding().decode(got_val[:-1].tolist()) == chunks[19]
    x, y = make_loader(data_dir, "val", 2, 1024, "cpu", 50304).next_batch()
    assert tuple(x.shape) == (2, 1024) and (x[:, 1:] == y[:, :-1]).all()
    assert f"val.bin: {len(val):,} tokens, sha256" in r.stdout
    assert "next: python train.py dev/techdocs_nanogpt.py" in r.stdout
    assert "linux-doc-6.1_1.0_all.deb: 2 documents" in r.stdout


def test_the_assembled_text_gives_the_same_files(built, tmp_path):
    out, _ = built
    r = run(PREPARE, f"--text={out / 'techdocs.txt.gz'}", f"--out_dir={tmp_path}")
    for name in ("train.bin", "val.bin", "meta.json"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
    assert not (tmp_path / "techdocs.txt.gz").exists() and "wrote" in r.stdout


def test_the_benchmarks_cut_by_hand():
    assert prepare.chunks_of("aaa\n\nbb\n\nc\n\ndddd\n\ne", chunk_chars=7) == ["aaa\n\nbb", "c\n\ndddd", "e"]
    assert prepare.chunks_of("aaaaaaa\n\nb", chunk_chars=7) == ["aaaaaaa", "b"]  # 7 + 2 >= 7: a chunk alone
    assert prepare.chunks_of("ab", chunk_chars=7) == ["ab"]
    train, val = prepare.split_tokens([[i] for i in range(41)])
    assert val == [19, 50256, 39, 50256] and len(train) == 2 * 39 and train[:4] == [0, 50256, 1, 50256]


def test_the_pinned_packages_are_checked_by_sha256(tmp_path):
    pkg = prepare.PACKAGES[2]
    path = tmp_path / pkg.filename
    path.write_bytes(b"perl")
    with pytest.raises(prepare.UserError, match="sha256"):
        prepare.check_sha256(pkg, str(path), "sha256 {got}")
    good = prepare.Package(pkg.name, pkg.version, pkg.source, pkg.pool, prepare.sha256_of(str(path)), pkg.select)
    prepare.check_sha256(good, str(path), "sha256 {got}")  # no error
    assert pkg.url == "https://deb.debian.org/debian-security/pool/updates/main/p/perl/perl-doc_5.36.0-7+deb12u4_all.deb"
    assert pkg.snapshot == "https://snapshot.debian.org/package/perl/5.36.0-7+deb12u4/"


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A local web server in place of Debian's mirror, serving tmp_path/served: its address."""
    import functools
    import http.server
    import threading
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(prepare, "MIRROR", f"http://127.0.0.1:{server.server_address[1]}/")
    yield served
    server.shutdown()


def test_a_download_is_checked_and_a_version_gone_from_the_mirror_is_one_line(mirror, tmp_path):
    data = b"a .deb"
    pkg = prepare.Package("perl-doc", "1.0", "perl", "pool/p/perl/", prepare.hashlib.sha256(data).hexdigest(), None)
    (mirror / "pool" / "p" / "perl").mkdir(parents=True)
    (mirror / "pool" / "p" / "perl" / pkg.filename).write_bytes(data)
    assert open(prepare.download(pkg, str(tmp_path)), "rb").read() == data
    with pytest.raises(prepare.UserError, match="sha256"):
        prepare.download(prepare.Package("perl-doc", "1.0", "perl", "pool/p/perl/", "0" * 64, None), str(tmp_path))
    gone = r"left the mirror .*HTTP 404.*snapshot.debian.org/package/perl/2.0/.*--debs"
    with pytest.raises(prepare.UserError, match=gone):
        prepare.download(prepare.Package("perl-doc", "2.0", "perl", "pool/p/perl/", "0" * 64, None), str(tmp_path))


def mistake(tmp_path, *args):
    out = tmp_path / "out"
    r = run(PREPARE, *args, f"--out_dir={out}", check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert not out.exists()  # nothing written
    return lines[0]


def copy(debs, folder, *names):
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes((debs / name).read_bytes())
    return folder


@pytest.mark.usefixtures("gpt2_ranks_path")
def test_mistakes_are_one_line_and_write_nothing(debs, tmp_path):
    assert "is not a folder" in mistake(tmp_path, f"--debs={tmp_path / 'nowhere'}")
    pinned = prepare.PACKAGES
    # the pinned names, the wrong bytes
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for pkg in pinned:
        (wrong / pkg.filename).write_bytes((debs / f"{pkg.name}_1.0_all.deb").read_bytes())
    line = mistake(tmp_path, f"--debs={wrong}")
    assert "sha256" in line and pinned[0].filename in line and "snapshot.debian.org" in line
    # other versions than the pinned ones, without --unpinned
    line = mistake(tmp_path, f"--debs={debs}")
    assert "linux-doc-6.1_1.0_all.deb" in line and "--unpinned" in line and pinned[0].filename in line
    # a package missing
    two = copy(debs, tmp_path / "two", "linux-doc-6.1_1.0_all.deb", "python3.11-doc_1.0_all.deb")
    assert "perl-doc" in mistake(tmp_path, f"--debs={two}", "--unpinned")
    # zstd, which tarfile cannot read (before Python 3.14)
    if not hasattr(tarfile, "ZstdFile"):
        zst = copy(debs, tmp_path / "zst", "linux-doc-6.1_1.0_all.deb", "python3.11-doc_1.0_all.deb")
        (zst / "perl-doc_1.0_all.deb").write_bytes(ar([("debian-binary", b"2.0\n"), ("data.tar.zst", b"(\xb5/\xfd")]))
        assert "zstd" in mistake(tmp_path, f"--debs={zst}", "--unpinned")
    # not a .deb at all
    bad = copy(debs, tmp_path / "bad", "linux-doc-6.1_1.0_all.deb", "python3.11-doc_1.0_all.deb")
    (bad / "perl-doc_1.0_all.deb").write_bytes(b"not an archive")
    assert "not a .deb" in mistake(tmp_path, f"--debs={bad}", "--unpinned")
    # options that do not go together, a text that is not one, too little text for a val chunk
    assert "not both" in mistake(tmp_path, f"--debs={debs}", "--text=x.txt.gz")
    assert "--unpinned" in mistake(tmp_path, "--unpinned")
    assert "does not exist" in mistake(tmp_path, f"--text={tmp_path / 'none.txt.gz'}")
    (tmp_path / "plain.txt.gz").write_bytes(b"not gzip")
    assert "could not be read" in mistake(tmp_path, f"--text={tmp_path / 'plain.txt.gz'}")
    (tmp_path / "short.txt.gz").write_bytes(gzip.compress(b"a few words"))
    assert "at least 20" in mistake(tmp_path, f"--text={tmp_path / 'short.txt.gz'}")


def test_train_names_the_builder_of_missing_techdocs(tmp_path):
    with pytest.raises(UserError, match=r"`python dev/techdocs.py --out_dir=\S*nowhere`"):
        find_dataset("techdocs", str(tmp_path / "nowhere"))  # --dataset=techdocs --data_dir=...
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no train split .*`python dev/techdocs.py --out_dir="):
        find_dataset("techdocs", str(tmp_path / "empty"))


def test_speedrun_builds_or_names_the_corpus(built, tmp_path, gpt2_ranks_path):
    out, _ = built
    with pytest.raises(SystemExit, match=r"python dev/techdocs.py --text="):
        speedrun.corpus(str(tmp_path / "missing"), "techdocs", "", "", "")
    with pytest.raises(SystemExit, match="--corpus_script"):
        speedrun.corpus(str(tmp_path / "missing"), "gcide", "", "", "")
    speedrun.corpus(str(tmp_path / "built"), "techdocs", str(out / "techdocs.txt.gz"), "", gpt2_ranks_path)
    assert (tmp_path / "built" / "val.bin").read_bytes() == (out / "val.bin").read_bytes()
    speedrun.corpus(str(out), "techdocs", "", "", "")  # already there: nothing to do
    settings = speedrun.nanogpt_settings(os.path.join(ROOT, "dev", "techdocs_nanogpt.py"))
    assert settings["dataset"] == "techdocs" and settings["max_iters"] % settings["eval_interval"] == 0
    assert settings["warmup_iters"] * 10 == settings["max_iters"] == settings["lr_decay_iters"]
