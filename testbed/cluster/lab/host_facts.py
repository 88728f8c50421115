"""Facts of a lab host, gathered on the host itself: Python, torch/CUDA/NCCL versions, GPUs, the data NIC (exists,
speed, addresses) and its shaping. One JSON line on stdout.

The lab backend sends this file's source to each host and runs it with the host's Python
(`python -c SOURCE IFACE`, see LabCluster.probe), so it imports nothing of testbed/ and keeps to syntax that old
interpreters parse: a host whose Python is too old still reports its version instead of failing to parse.
"""

import json
import os
import shutil
import subprocess
import sys


def main(iface):
    out = {"python": list(sys.version_info[:3]), "executable": sys.executable}
    safe = bool(iface) and "/" not in iface and iface not in (".", "..")
    path = os.path.join("/sys/class/net", iface) if safe else None
    out["iface_exists"] = bool(path and os.path.isdir(path))
    try:
        out["ifaces"] = sorted(os.listdir("/sys/class/net"))
    except OSError:
        out["ifaces"] = []
    speed = None
    if out["iface_exists"]:
        try:
            speed = int(open(os.path.join(path, "speed")).read().strip())
        except Exception:
            speed = None
    out["nic_speed_mbps"] = speed if speed and speed > 0 else None
    addrs = []
    if out["iface_exists"]:
        try:
            r = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", iface], stdout=subprocess.PIPE, timeout=10)
            for link in json.loads(r.stdout.decode() or "[]"):
                for a in link.get("addr_info", []):
                    addrs.append(a["local"])
        except Exception:
            pass
    out["addresses"] = addrs
    smi = shutil.which("nvidia-smi")
    gpus = 0
    if smi:
        try:
            r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, timeout=30)
            gpus = sum(1 for line in r.stdout.decode().splitlines() if line.startswith("GPU "))
        except Exception:
            gpus = 0
    out["gpus"] = gpus
    out["nvidia_smi"] = bool(smi)
    out["driver_version"] = None
    out["gpu_name"] = None
    if smi and gpus:
        try:
            r = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               stdout=subprocess.PIPE, timeout=30)
            first = r.stdout.decode().splitlines()[0].split(",")
            out["gpu_name"], out["driver_version"] = first[0].strip(), first[1].strip()
        except Exception:
            pass
    try:  # versions from package metadata: importing torch costs seconds per host
        from importlib import metadata, util

        out["torch"] = metadata.version("torch")
        spec = util.find_spec("torch")
        out["cuda"] = None
        try:
            text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
            for line in text.splitlines():
                if line.startswith("cuda"):
                    out["cuda"] = line.split("=", 1)[1].strip().strip("'\"") or None
        except Exception:
            pass
        out["nccl"] = None
        for dist in metadata.distributions():
            name = (dist.metadata["Name"] or "").lower()
            if name.startswith("nvidia-nccl"):
                out["nccl"] = dist.version
    except Exception as e:
        out["torch"] = None
        out["torch_error"] = str(e)[:200]
    try:
        from shaping import ingress, tc

        out["project"] = True
        if out["iface_exists"]:
            out["shaping"] = {"egress": tc.show(iface), "ingress": ingress.show(iface)}
    except Exception as e:
        out["project"] = out.get("project", False)
        out["project_error"] = str(e)[:200]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
