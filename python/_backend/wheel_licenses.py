"""Add the copyright files of the Debian packages whose libraries auditwheel
bundled into a repaired wheel (kvtier_build.build_wheel, after `auditwheel
repair`; by hand: python3 python/_backend/wheel_licenses.py WHEEL).

auditwheel lists each bundled library's package in the wheel's SBOM
(<name>.dist-info/sboms/auditwheel.cdx.json, purls pkg:deb/debian/NAME@V);
this copies /usr/share/doc/NAME/copyright of the build host (the package the
library came from) to <name>.dist-info/licenses/debian/NAME.copyright and
rewrites the wheel in place with its RECORD updated. A package without a
copyright file on the host is reported on stderr (the wheel then carries
its library without the license text).
"""

import base64
import hashlib
import json
import os
import sys
import tempfile
import zipfile


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def add_licenses(wheel):
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
        distinfo = next(i.filename.split("/")[0] for i in infos
                        if i.filename.split("/")[0].endswith(".dist-info"))
        sbom = json.loads(z.read(distinfo + "/sboms/auditwheel.cdx.json"))
        contents = {i.filename: z.read(i.filename) for i in infos}
    pkgs = sorted({c["name"] for c in sbom.get("components", [])
                   if c.get("purl", "").startswith("pkg:deb/")})
    added = {}
    missing = []
    for p in pkgs:
        src = "/usr/share/doc/%s/copyright" % p
        if not os.path.isfile(src):
            missing.append(p)
            continue
        with open(src, "rb") as f:
            added["%s/licenses/debian/%s.copyright" % (distinfo, p)] = f.read()
    if missing:
        # a Debian image that drops /usr/share/doc (docker's slim ones):
        # build anyway, but say what the wheel lacks
        print("kvtier: WARNING: no /usr/share/doc/<package>/copyright on this host for %s: "
              "the wheel bundles their libraries without the license text"
              % ", ".join(missing), file=sys.stderr)
    record = distinfo + "/RECORD"
    lines = [l for l in contents[record].decode().splitlines()
             if l and l.split(",")[0] not in added and l.split(",")[0] != record]
    lines += [record_line(n, d) for n, d in sorted(added.items())]
    lines.append(record + ",,")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(wheel)), suffix=".whl")
    os.close(fd)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for i in infos:
            if i.filename == record or i.filename in added:
                continue
            out.writestr(i, contents[i.filename])  # the ZipInfo keeps the mode bits
        for n, d in sorted(added.items()):
            zi = zipfile.ZipInfo(n, date_time=infos[0].date_time)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(zi, d)
        zi = zipfile.ZipInfo(record, date_time=infos[0].date_time)
        zi.external_attr = 0o644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        out.writestr(zi, "\n".join(lines) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, wheel)
    print("kvtier: %d copyright files of bundled Debian packages in %s/licenses/debian"
          % (len(added), distinfo), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    add_licenses(sys.argv[1])
