#!/usr/bin/env python3
"""A TUF repository made by python-tuf (7.x), the reference implementation,
laid out as the repositories sigil refreshes its built-in trusted roots from,
so sigil's TUF client is tested against metadata it did not write.

Layouts:
  github    as tuf-on-ci writes GitHub's (tuf-repo.github.com): ECDSA P-256
            keys carrying x-tuf-on-ci-keyowner / x-tuf-on-ci-online-uri, their
            key IDs computed WITHOUT those fields (so a client that recomputes
            IDs over the whole key object refuses it); root and targets 2 of 3,
            one online key for timestamp and snapshot; consistent snapshots.
  sigstore  as Sigstore's root-signing writes public-good's: the same roles,
            keys also carrying keyid_hash_algorithms, their IDs computed over
            the whole key object; a delegated role registry.npmjs.org.
  delegated the github layout with trusted_root.json in a delegated role.

State (the private keys) lives in STATE/keys.json; STATE/repo is what is served
(metadata at its root, targets under targets/). Every timestamp ever written
is kept in STATE/history for the rollback attack.

Usage:
  tuf-repo.py init STATE --layout L --target FILE
  tuf-repo.py publish STATE --target FILE      new targets, snapshot, timestamp
  tuf-repo.py rotate-root STATE                new root keys (old and new sign)
  tuf-repo.py attack STATE KIND                rollback | freeze | arbitrary |
                                               mix-and-match | endless | below-threshold
"""

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
from datetime import datetime, timedelta, timezone

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

TARGET = "trusted_root.json"
NPM_TARGET = "registry.npmjs.org/keys.json"
PRETTY = JSONSerializer(compact=False)


def now():
    return datetime.now(timezone.utc).replace(microsecond=0)


def make_key(layout, owner, online=False):
    """A fresh ECDSA P-256 signer whose public key is listed as `layout` lists it."""
    fresh = CryptoSigner.generate_ecdsa()
    pub = fresh.public_key
    fields = {}
    if layout == "sigstore":
        fields["keyid_hash_algorithms"] = ["sha256", "sha512"]
    if online:
        fields["x-tuf-on-ci-online-uri"] = "gcpkms:projects/test/keys/online"
    else:
        fields["x-tuf-on-ci-keyowner"] = owner
    body = {"keytype": pub.keytype, "scheme": pub.scheme, "keyval": pub.keyval}
    if layout == "sigstore":
        # root-signing's IDs: over the whole key object, custom fields included.
        keyid = hashlib.sha256(encode_canonical({**body, **fields}).encode()).hexdigest()
    else:
        # tuf-on-ci's IDs: over keytype, scheme and keyval only.
        keyid = pub.keyid
    return {
        "keyid": keyid,
        "private": fresh.private_bytes.decode(),
        "public": {**body, **fields},
    }


def signer(k):
    pub = k["public"]
    fields = {f: v for f, v in pub.items() if f not in ("keytype", "scheme", "keyval")}
    key = SSlibKey(k["keyid"], pub["keytype"], pub["scheme"], pub["keyval"], fields)
    return CryptoSigner(load_pem_private_key(k["private"].encode(), None), key)


def public(k):
    return signer(k).public_key


class Repo:
    def __init__(self, state):
        self.state = state
        self.repo = os.path.join(state, "repo")
        with open(os.path.join(state, "keys.json")) as f:
            self.s = json.load(f)

    def save(self):
        with open(os.path.join(self.state, "keys.json"), "w") as f:
            json.dump(self.s, f, indent=1)

    def write(self, name, md, signers):
        md.signatures.clear()
        for k in signers:
            md.sign(signer(k), append=True)
        data = md.to_bytes(PRETTY)
        path = os.path.join(self.repo, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return data

    def latest(self, role):
        """The newest metadata of a top-level role, or None."""
        if role == "timestamp":
            path = os.path.join(self.repo, "timestamp.json")
            return Metadata.from_file(path) if os.path.exists(path) else None
        versions = [int(n.split(".")[0]) for n in os.listdir(self.repo) if n.endswith("." + role + ".json")]
        if not versions:
            return None
        return Metadata.from_file(os.path.join(self.repo, f"{max(versions)}.{role}.json"))

    def keys(self, role):
        return [self.s["keys"][i] for i in self.s["roles"][role]]

    def root(self, version, expires_days=365):
        r = Root(version=version, expires=now() + timedelta(days=expires_days), consistent_snapshot=True)
        for role in ("root", "targets", "snapshot", "timestamp"):
            for k in self.keys(role):
                r.add_key(public(k), role)
            r.roles[role].threshold = self.s["thresholds"][role]
        return Metadata(r)

    def add_target(self, targets, path, data):
        targets.targets[path] = TargetFile.from_data(path, data, ["sha256", "sha512"])
        digest = hashlib.sha256(data).hexdigest()
        d, _, base = path.rpartition("/")
        out = os.path.join(self.repo, "targets", d, f"{digest}.{base}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(data)

    def delegate(self, t, meta, version, role, paths, path, data):
        """Delegates `paths` from targets `t` to `role` (terminating, the
        delegate key), whose metadata of `version` holds `path` = `data`."""
        d = Targets(version=version, expires=now() + timedelta(days=365))
        self.add_target(d, path, data)
        self.write(f"{version}.{role}.json", Metadata(d), self.keys("delegate"))
        meta[f"{role}.json"] = MetaFile(version=version)
        dk = self.keys("delegate")
        t.delegations = Delegations(
            keys={k["keyid"]: public(k) for k in dk},
            roles={role: DelegatedRole(role, [k["keyid"] for k in dk], 1, True, paths=[paths])},
        )

    def publish(self, target, timestamp_expires=timedelta(days=7)):
        layout = self.s["layout"]
        latest = self.latest("targets")
        tv = latest.signed.version + 1 if latest else 1
        meta = {}
        t = Targets(version=tv, expires=now() + timedelta(days=365))
        if layout == "delegated":
            self.delegate(t, meta, tv, "sigstore", "*.json", TARGET, target)
        else:
            self.add_target(t, TARGET, target)
        if layout == "sigstore":
            self.delegate(t, meta, tv, "registry.npmjs.org", "registry.npmjs.org/*", NPM_TARGET, b'{"keys": []}\n')
        self.write(f"{tv}.targets.json", Metadata(t), self.keys("targets"))
        meta["targets.json"] = MetaFile(version=tv)
        s = Snapshot(version=tv, expires=now() + timedelta(days=30), meta=meta)
        sdata = self.write(f"{tv}.snapshot.json", Metadata(s), self.keys("snapshot"))
        self.timestamp(tv, MetaFile(version=tv, length=len(sdata), hashes={"sha256": hashlib.sha256(sdata).hexdigest()}), timestamp_expires)

    def timestamp(self, snapshot_version, snapshot_meta, expires=timedelta(days=7), signers=None):
        latest = self.latest("timestamp")
        v = latest.signed.version + 1 if latest else 1
        ts = Timestamp(version=v, expires=now() + expires, snapshot_meta=snapshot_meta)
        data = self.write("timestamp.json", Metadata(ts), signers or self.keys("timestamp"))
        hist = os.path.join(self.state, "history")
        os.makedirs(hist, exist_ok=True)
        with open(os.path.join(hist, f"timestamp.{v}.json"), "wb") as f:
            f.write(data)


def init(state, layout, target):
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(os.path.join(state, "repo"))
    keys, roles = {}, {}
    for role in ("root", "targets"):
        ks = [make_key(layout, f"@{role}-owner-{i}") for i in range(3)]
        keys.update({k["keyid"]: k for k in ks})
        roles[role] = [k["keyid"] for k in ks]
    online = make_key(layout, "", online=True)
    keys[online["keyid"]] = online
    roles["timestamp"] = roles["snapshot"] = [online["keyid"]]
    delegate = make_key(layout, "@delegate")
    keys[delegate["keyid"]] = delegate
    roles["delegate"] = [delegate["keyid"]]
    with open(os.path.join(state, "keys.json"), "w") as f:
        json.dump({"layout": layout, "keys": keys, "roles": roles,
                   "thresholds": {"root": 2, "targets": 2, "snapshot": 1, "timestamp": 1}}, f, indent=1)
    r = Repo(state)
    r.write("1.root.json", r.root(1), r.keys("root"))
    r.publish(target)


def rotate_root(r):
    old = r.keys("root")
    new = [make_key(r.s["layout"], f"@new-root-owner-{i}") for i in range(3)]
    for k in new:
        r.s["keys"][k["keyid"]] = k
    r.s["roles"]["root"] = [k["keyid"] for k in new]
    r.save()
    v = r.latest("root").signed.version + 1
    # Signed by a threshold of the old root keys and of the new ones.
    r.write(f"{v}.root.json", r.root(v), old[:2] + new[:2])


def attack(r, kind):
    ts = r.latest("timestamp")
    snap_meta = ts.signed.snapshot_meta
    if kind == "rollback":
        # The previous timestamp, served again.
        prev = ts.signed.version - 1
        shutil.copy(os.path.join(r.state, "history", f"timestamp.{prev}.json"), os.path.join(r.repo, "timestamp.json"))
    elif kind == "freeze":
        r.timestamp(snap_meta.version, snap_meta, expires=timedelta(days=-1))
    elif kind == "arbitrary":
        stranger = make_key(r.s["layout"], "", online=True)
        r.timestamp(snap_meta.version, snap_meta, signers=[stranger])
    elif kind == "mix-and-match":
        # The newest targets metadata's name serves the previous version.
        v = r.latest("targets").signed.version
        shutil.copy(os.path.join(r.repo, f"{v - 1}.targets.json"), os.path.join(r.repo, f"{v}.targets.json"))
    elif kind == "endless":
        # A timestamp that never ends (python-tuf's cap is 16 KiB).
        with open(os.path.join(r.repo, "timestamp.json"), "wb") as f:
            f.write(b"{" + b" " * (4 << 20) + b"}")
    elif kind == "below-threshold":
        # One compromised root key (threshold 2) rotates the timestamp key to
        # the attacker's, alone.
        attacker = make_key(r.s["layout"], "", online=True)
        r.s["keys"][attacker["keyid"]] = attacker
        compromised = r.keys("root")[0]
        r.s["roles"]["timestamp"] = [attacker["keyid"]]
        v = r.latest("root").signed.version + 1
        r.write(f"{v}.root.json", r.root(v), [compromised])
        r.save()
        r.timestamp(snap_meta.version, snap_meta)
    else:
        sys.exit(f"unknown attack {kind!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["init", "publish", "rotate-root", "attack"])
    p.add_argument("state")
    p.add_argument("kind", nargs="?")
    p.add_argument("--layout", default="github", choices=["github", "sigstore", "delegated"])
    p.add_argument("--target")
    a = p.parse_args()
    if a.command == "init":
        with open(a.target, "rb") as f:
            init(a.state, a.layout, f.read())
        return
    r = Repo(a.state)
    if a.command == "publish":
        with open(a.target, "rb") as f:
            r.publish(f.read())
    elif a.command == "rotate-root":
        rotate_root(r)
    else:
        attack(r, a.kind)


if __name__ == "__main__":
    main()
