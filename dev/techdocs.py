"""
Prepare techdocs, the speedrun benchmark's second corpus: English software documentation from three Debian
bookworm packages - the Linux kernel's Documentation/ (linux-doc-6.1: its .rst and .txt files, without the
translations/ and the devicetree/ bindings), Python 3.11's manual (python3.11-doc: the Sphinx sources) and
Perl's core documentation (perl-doc: pod/*.pod) - about 42 MB of text. It is cut and tokenized exactly as
the benchmark's gcide corpus: at blank lines into chunks of about 64 KB, every 20th chunk to val, each chunk
GPT-2 BPE followed by <|endoftext|> (50256), uint16.

    python dev/techdocs.py                                 # downloads the three pinned .deb files (58 MB)
    python dev/techdocs.py --debs=DIR                      # the same files, already on this machine
    python dev/techdocs.py --text=path/to/techdocs.txt.gz  # the text an earlier run assembled

Writes to --out_dir (default: data/techdocs, where train.py's --dataset=techdocs finds it): techdocs.txt.gz
(the assembled text, its documents in path order, a blank line between two; not with --text), train.bin,
val.bin and meta.json. The .deb files are pinned by version and sha256 and read here (an ar archive holding
data.tar.xz), so no dpkg is needed and the same files always give the same corpus. Offline, give --debs or
--text and set GPT2_TIKTOKEN_FILE to a local gpt2.tiktoken ranks file.
"""
import argparse
import glob
import gzip
import hashlib
import io
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt.data.sources import make_out_dir, say_next, write_meta, write_tokens
from gpt.data.tokenizer import GPT2_EOT, dataset_tokenizer, gpt2_encoding
from gpt.runtime import errors
from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write

DATA_DIR = os.path.join(ROOT, "data", "techdocs")  # train.py's data/<dataset> for --dataset=techdocs
TEXT_NAME = "techdocs.txt.gz"
MIRROR = "https://deb.debian.org/"
SNAPSHOT = "https://snapshot.debian.org/package/"

# the benchmark's cut (its make_corpus.py): chunks of at least this many characters (a paragraph's length
# plus 2 for its blank line), ended at a paragraph; chunk i is val when i % VAL_EVERY == VAL_EVERY - 1
CHUNK_CHARS = 65536
VAL_EVERY = 20

LINUX_DOCS = "usr/share/doc/linux-doc-6.1/Documentation/"
# translations/ is not English; devicetree/ is hardware bindings (YAML schemas and the .txt ones they replace)
LINUX_LEFT_OUT = ("translations", "devicetree")
PYTHON_SOURCES = "usr/share/doc/python3.11/html/_sources/"
PERL_POD = "usr/share/perl/5.36.0/pod/"


def linux_doc(path):
    if not path.startswith(LINUX_DOCS):
        return False
    rel = path[len(LINUX_DOCS):]
    name = rel[:-3] if rel.endswith(".gz") else rel  # Debian gzips all but the smallest files
    return rel.split("/")[0] not in LINUX_LEFT_OUT and name.endswith((".rst", ".txt"))


def python_doc(path):
    return path.startswith(PYTHON_SOURCES) and path.endswith(".rst.txt")


def perl_doc(path):
    return path.startswith(PERL_POD) and path.endswith(".pod") and "/" not in path[len(PERL_POD):]


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    source: str  # the source package, which names the snapshot.debian.org page
    pool: str  # its folder on the mirror
    sha256: str
    select: object  # path inside the package -> whether it is one of the corpus's documents

    @property
    def filename(self):
        return f"{self.name}_{self.version}_all.deb"

    @property
    def url(self):
        return f"{MIRROR}{self.pool}{self.filename}"

    @property
    def snapshot(self):
        return f"{SNAPSHOT}{self.source}/{self.version}/"


# bookworm's versions of 2026-11 (security updates, hence debian-security's pool)
PACKAGES = (
    Package("linux-doc-6.1", "6.1.192-2", "linux", "debian-security/pool/updates/main/l/linux/",
            "d1d1b5a602f0d439ecc39e713e044bf2df30d839fb4bf8a7b859ba3273c47993", linux_doc),
    Package("python3.11-doc", "3.11.2-6+deb12u9", "python3.11", "debian-security/pool/updates/main/p/python3.11/",
            "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be", python_doc),
    Package("perl-doc", "5.36.0-7+deb12u4", "perl", "debian-security/pool/updates/main/p/perl/",
            "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8", perl_doc),
)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def how_to_fetch(pkg):
    return (f"fetch {pkg.filename} from {pkg.url} (or, once it has left the mirror, from {pkg.snapshot}, "
            f"where snapshot.debian.org keeps every version) into a folder and pass --debs=FOLDER")


def local_debs(folder, unpinned):
    """{package: path} of the three .deb files in folder, each checked: the pinned file by its sha256, or with
    unpinned the one version of the package the folder holds."""
    if not os.path.isdir(folder):
        raise UserError(f"--debs {folder} is not a folder: give the folder that holds "
                        f"{', '.join(pkg.filename for pkg in PACKAGES)}")
    found = {}
    for pkg in PACKAGES:
        path = os.path.join(folder, pkg.filename)
        versions = sorted(glob.glob(os.path.join(glob.escape(folder), f"{pkg.name}_*.deb")))
        if unpinned:
            if len(versions) != 1:
                held = f"{len(versions)} of them ({', '.join(map(os.path.basename, versions))})" if versions else "none"
                raise UserError(f"--debs {folder} must hold one {pkg.name}_*.deb with --unpinned, it holds {held}")
            found[pkg] = versions[0]
        elif os.path.isfile(path):
            found[pkg] = path
        elif versions:
            raise UserError(f"--debs {folder} holds {', '.join(map(os.path.basename, versions))}, not the pinned "
                            f"{pkg.filename}: {how_to_fetch(pkg)}; or pass --unpinned to build from the versions "
                            f"you have (then it is not the benchmark's corpus)")
        else:
            raise UserError(f"--debs {folder} has no {pkg.name} package ({pkg.filename}): {how_to_fetch(pkg)}")
    if unpinned:
        print(f"--unpinned: {', '.join(map(os.path.basename, found.values()))}, unchecked: not the benchmark's corpus "
              f"unless they are the pinned files")
    else:
        for pkg, path in found.items():
            check_sha256(pkg, path, f"{path} has sha256 {{got}}, not {pkg.filename}'s pinned {pkg.sha256[:16]}...: "
                                    f"it is damaged or another build; {how_to_fetch(pkg)}")
    return found


def check_sha256(pkg, path, message):
    got = sha256_of(path)
    if got != pkg.sha256:
        raise UserError(message.format(got=got[:16] + "..."))


def download(pkg, folder):
    """The pinned .deb from Debian's mirror into folder, checked by its sha256; its path."""
    path = os.path.join(folder, pkg.filename)
    print(f"downloading {pkg.url}", flush=True)
    try:
        with urllib.request.urlopen(pkg.url, timeout=60) as r, open(path, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except urllib.error.HTTPError as e:
        if e.code in (404, 410):
            raise UserError(f"{pkg.filename} has left the mirror ({pkg.url}: HTTP {e.code}); Debian's mirrors keep "
                            f"only current versions: download it from {pkg.snapshot} (snapshot.debian.org keeps "
                            f"every version) into a folder and pass --debs=FOLDER")
        raise UserError(f"could not download {pkg.url} (HTTP {e.code} {e.reason}): try again, or {how_to_fetch(pkg)}")
    except OSError as e:  # no network, DNS, a timeout, a cut connection (URLError is an OSError)
        reason = getattr(e, "reason", None) or e.strerror or e
        raise UserError(f"could not download {pkg.url} ({reason}): without a network, pass --debs=FOLDER with the "
                        f"three .deb files, or --text={TEXT_NAME} assembled by an earlier run")
    check_sha256(pkg, path, f"the download of {pkg.url} has sha256 {{got}}, not the pinned {pkg.sha256[:16]}...: "
                            f"try again, or {how_to_fetch(pkg)}")
    return path


def deb_data(path):
    """The data.tar.* member of a .deb (an ar archive: debian-binary, control.tar.*, data.tar.*) as
    (name, bytes)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise UserError(f"{path} is not a .deb file (no ar archive header)")
        while True:
            header = f.read(60)
            if not header:
                raise UserError(f"{path} holds no data.tar member: not a Debian binary package")
            if len(header) < 60 or header[58:60] != b"`\n":
                raise UserError(f"{path} is a damaged .deb file (a cut-off or bad ar member header)")
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            try:
                size = int(header[48:58])
            except ValueError:
                raise UserError(f"{path} is a damaged .deb file (member {name!r} has no size)") from None
            if name.startswith("data.tar"):
                data = f.read(size)
                if len(data) < size:
                    raise UserError(f"{path} is cut off: its {name} is {len(data):,} of {size:,} bytes")
                return name, data
            f.seek(size + size % 2, os.SEEK_CUR)  # members start at even offsets


COMPRESSION = {"data.tar": "", "data.tar.xz": "xz", "data.tar.gz": "gz", "data.tar.bz2": "bz2", "data.tar.zst": "zst"}


def deb_documents(path, select):
    """[(path inside the package, text)] of the regular files of a .deb that select() picks; gzipped ones
    (Debian's .gz) are read as their content. Text is UTF-8 (a stray byte becomes U+FFFD), its line ends \\n."""
    name, data = deb_data(path)
    if name not in COMPRESSION:
        raise UserError(f"{path}: its {name} is a kind of archive this script does not read (known: "
                        f"{', '.join(COMPRESSION)})")
    docs = []
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode=f"r|{COMPRESSION[name]}")
    except tarfile.CompressionError:
        raise UserError(f"{path}: its {name} is zstd-compressed, which this Python's tarfile cannot read: "
                        f"repack it as data.tar.xz (dpkg-deb -R, then dpkg-deb -Zxz -b), or pass --text") from None
    try:
        with tar:
            for member in tar:
                inner = member.name[2:] if member.name.startswith("./") else member.name
                if member.isfile() and select(inner):
                    raw = tar.extractfile(member).read()
                    if inner.endswith(".gz"):
                        raw = gzip.decompress(raw)
                    docs.append((inner, document_text(raw)))
    except (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError, OSError) as e:
        raise UserError(f"{path}: its {name} is damaged ({type(e).__name__}: {e})") from None
    return docs


def document_text(raw):
    """A file's bytes as a document: UTF-8 (a byte order mark dropped, a stray byte U+FFFD), \\r\\n and \\r made
    \\n, blank lines at its start and whitespace at its end stripped."""
    text = raw.decode("utf-8-sig", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return text.lstrip("\n").rstrip()


def assemble(debs):
    """The corpus text of {package: .deb path}: every document, in path order, a blank line between two."""
    docs = []
    for pkg, path in debs.items():
        found = deb_documents(path, pkg.select)
        if not found:
            raise UserError(f"{path} holds none of the documents this script takes from {pkg.name}: is it "
                            f"{pkg.name}, of Debian bookworm?")
        size = sum(len(text.encode("utf-8")) for _, text in found)
        print(f"{os.path.basename(path)}: {len(found):,} documents, {size / 1e6:.1f} MB")
        docs += found
    return "\n\n".join(text for _, text in sorted(docs) if text)


def read_corpus_text(path):
    """The text of --text as the benchmark's make_corpus.py reads gcide.txt.gz: UTF-8 (stray bytes U+FFFD),
    universal newlines; gzipped when the name ends in .gz."""
    if not os.path.isfile(path):
        raise UserError(f"--text {path} {'is a folder' if os.path.isdir(path) else 'does not exist'}: give the "
                        f"{TEXT_NAME} an earlier run of this script wrote")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                return f.read()
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"--text {path} could not be read ({e}): not gzip, or damaged; rebuild it from the .deb "
                        f"files (--debs, or no option to download them)") from None


def chunks_of(text, chunk_chars=CHUNK_CHARS):
    """The benchmark's cut: paragraphs (split at '\\n\\n') gathered into chunks of at least chunk_chars
    characters (each paragraph counting 2 more), rejoined with '\\n\\n'; the last chunk may be shorter."""
    chunks, cur, size = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        size += len(para) + 2
        if size >= chunk_chars:
            chunks.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


def split_tokens(chunk_ids):
    """(train, val) token lists of the chunks' ids: every VAL_EVERY-th chunk to val, each chunk followed
    by <|endoftext|>."""
    train, val = [], []
    for i, ids in enumerate(chunk_ids):
        (val if i % VAL_EVERY == VAL_EVERY - 1 else train).extend([*ids, GPT2_EOT])
    return train, val


def write_text(path, text):
    """The assembled text, gzipped the same way every time (no name, no time stamp in the header)."""
    with atomic_write(path) as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as gz:
            gz.write(text.encode("utf-8"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debs", help="a folder holding the three .deb files (default: download them)")
    parser.add_argument("--text", help=f"the assembled text ({TEXT_NAME}) of an earlier run: no .deb files needed")
    parser.add_argument("--unpinned", action="store_true",
                        help="with --debs: take whatever version of each package the folder holds, unchecked "
                             "(a different corpus from the benchmark's)")
    parser.add_argument("--out_dir", default=DATA_DIR)
    args = parser.parse_args(argv)
    if args.debs and args.text:
        raise UserError("give --debs or --text, not both: --text is the text already assembled from the .deb files")
    if args.unpinned and not args.debs:
        raise UserError("--unpinned takes the versions in a --debs folder; downloads are always the pinned ones")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise UserError(f"--out_dir {args.out_dir} is a file, not a folder: choose another --out_dir")
    enc = gpt2_encoding()  # no GPT-2 BPE is one line now, not after a download

    if args.text:
        text = read_corpus_text(args.text)
        print(f"{args.text}: {len(text):,} characters")
    else:
        with tempfile.TemporaryDirectory(prefix="techdocs-") as tmp:
            debs = local_debs(args.debs, args.unpinned) if args.debs else {pkg: download(pkg, tmp) for pkg in PACKAGES}
            text = assemble(debs)
    size = len(text.encode("utf-8"))
    chunks = chunks_of(text)
    if len(chunks) < VAL_EVERY:
        raise UserError(f"the text is {len(chunks)} chunk(s) of ~{CHUNK_CHARS // 1024} KB ({size:,} bytes); every "
                        f"{VAL_EVERY}th is val, so it needs at least {VAL_EVERY}")
    print(f"{size / 1e6:.1f} MB of text, sha256 {hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}: "
          f"{len(chunks):,} chunks, every {VAL_EVERY}th to val", flush=True)
    train, val = split_tokens(enc.encode_ordinary_batch(chunks))  # "<|endoftext|>" in a document is text

    make_out_dir(args.out_dir)
    written = []
    if not args.text:
        text_path = os.path.join(args.out_dir, TEXT_NAME)
        write_text(text_path, text)
        print(f"{TEXT_NAME}: {os.path.getsize(text_path) / 1e6:.1f} MB")
        written.append(TEXT_NAME)
    for name, ids in (("train", train), ("val", val)):
        write_tokens(os.path.join(args.out_dir, f"{name}.bin"), ids, "uint16")
        with open(os.path.join(args.out_dir, f"{name}.bin"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        print(f"{name}.bin: {len(ids):,} tokens, sha256 {digest}")
    _, meta = dataset_tokenizer("gpt2", args.out_dir)
    write_meta(args.out_dir, meta)  # last: a folder with meta.json is a finished dataset
    print(f"wrote {args.out_dir}: {', '.join(written + ['train.bin', 'val.bin', 'meta.json'])}")
    say_next("dev/techdocs_nanogpt.py", args.out_dir, DATA_DIR, "  (nanoGPT's recipe sized for it)")


if __name__ == "__main__":
    errors.install()
    main()
