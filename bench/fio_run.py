"""fio as the Python benchmarks run it beside kvtier: psync jobs of 4 MiB
I/O, their bandwidth from fio's JSON report.

    from fio_run import fio_bw
    fio_bw("read", 4, ["--directory=D", "--nrfiles=8", "--filesize=4M"])
"""

import json
import subprocess


def fio_bw(rw, jobs, args):
    """Bytes per second of fio doing rw ("read" or "write") with jobs psync
    jobs in 4 MiB blocks; args name the files (--directory/--filename, their
    number and size) and the mode (--direct=1)."""
    r = subprocess.run(["fio", "--name=kvtb", "--rw=" + rw, "--bs=4M", "--ioengine=psync",
                        "--numjobs=%d" % jobs, "--group_reporting", "--output-format=json"]
                       + list(args), capture_output=True, text=True, check=True)
    return json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0][rw]["bw_bytes"]
