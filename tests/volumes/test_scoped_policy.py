"""The session policy on workers' scoped S3 credentials, judged by a real IAM policy evaluator.

moto ignores STS session policies (credentials for one volume read another there), so the policy
Veri sends to `AssumeRole` is captured on its way and evaluated with `@cloud-copilot/iam-simulate`
(`tests/volumes/iam/`, installed by `make test`) against the requests that matter: what a
worker must be able to do, and every neighbour it must not reach. A session's permissions are the
intersection of its role's policies and its session policy; the role here allows everything, so
the session policy alone must confine the credentials.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from volumes.stores import S3Store, get_store, keys

IAM = Path(__file__).with_name("iam")
EVALUATOR = IAM / "evaluate.mjs"

ACCOUNT = "123456789012"
PRINCIPAL = f"arn:aws:sts::{ACCOUNT}:assumed-role/veri-worker-storage/veri-0123456789abcdef"
KMS_KEY = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OTHER_KMS_KEY = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/ffffffff-12ab-34cd-56ef-1234567890ab"
VIA_S3 = {"kms:ViaService": "s3.us-east-1.amazonaws.com"}
ROLE_ALLOWS_ALL = {
    "name": "role",
    "policy": {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    },
}
# A KMS key's default policy: the account's IAM policies decide who uses it.
KEY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
            "Action": "kms:*",
            "Resource": "*",
        }
    ],
}
VOLUME = keys.volume_prefix("ws_a", "vol_1")
SIBLING = keys.volume_prefix("ws_a", "vol_10")  # `vol_1` without its slash would reach it
OTHER_WORKSPACE = keys.volume_prefix("ws_b", "vol_1")
JOB = keys.job_prefix("ws_a", "job_1")
FINAL = keys.checkpoint_prefix(JOB, step=0, final=True)


def evaluate(policy: dict, requests: list[tuple]) -> list[str]:
    """Each `(action, resource, context)` judged for a session with `policy`: "Allowed",
    "ImplicitlyDenied" or "ExplicitlyDenied". An invalid request or policy fails the test."""
    node = shutil.which("node")
    if node is None or not (IAM / "node_modules" / "@cloud-copilot" / "iam-simulate").exists():
        pytest.fail(
            "The IAM evaluator is not installed: `make tests/volumes/iam/node_modules/.installed` "
            "(make test does it; needs node and npm)."
        )
    body = {
        "principal": PRINCIPAL,
        "policies": [ROLE_ALLOWS_ALL, {"name": "session", "policy": policy}],
        "requests": [
            {
                "action": action,
                "resource": resource,
                "context": context,
                **({"resourcePolicy": KEY_POLICY} if action.startswith("kms:") else {}),
            }
            for action, resource, context in requests
        ],
    }
    result = subprocess.run(
        [node, str(EVALUATOR)], input=json.dumps(body), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def s3(s3_store_url, settings) -> S3Store:
    """The configured S3 store as production has it: a role to assume, a KMS-encrypted bucket."""
    settings.VERI_STORE = s3_store_url
    settings.VERI_STORE_KMS_KEY_ARN = KMS_KEY
    settings.AWS_REGION = "us-east-1"
    store = get_store()
    assert isinstance(store, S3Store)
    return store


def sent_policies(store: S3Store) -> list[dict]:
    """The session policies of the store's AssumeRole calls from now on, as sent."""
    sent: list[dict] = []
    store.sts.meta.events.register(
        "provide-client-params.sts.AssumeRole",
        lambda params, **kw: sent.append(json.loads(params["Policy"])),
    )
    return sent


def arn(store: S3Store, key: str = "") -> str:
    """The ARN of `key` (a store key, under the store's root) or, with none, of the bucket."""
    bucket = f"arn:aws:s3:::{store.bucket}"
    return f"{bucket}/{store.root}{key}" if key else bucket


def listing(store: S3Store, prefix: str | None) -> dict:
    """ListBucket's context: the `prefix` asked for (None: the whole bucket, no prefix sent)."""
    return {} if prefix is None else {"s3:prefix": prefix}


def read_cases(store: S3Store) -> list[tuple[str, str, str, dict]]:
    """(expected, action, resource, context) for credentials reading VOLUME."""
    own = arn(store, VOLUME.key("data/train.jsonl"))
    root = store.root
    allowed = [
        ("s3:GetObject", own, {}),
        ("s3:GetObject", arn(store, VOLUME.key("a.txt")), {}),
        ("s3:ListBucket", arn(store), listing(store, root + VOLUME.value)),
        ("s3:ListBucket", arn(store), listing(store, root + VOLUME.value + "data/")),
        ("kms:Decrypt", KMS_KEY, VIA_S3),
    ]
    denied = [
        # Neighbours: a sibling volume whose id starts the same, another workspace, a job's
        # outputs, the volume's folder name as an object, the bucket outside the root.
        ("s3:GetObject", arn(store, SIBLING.key("a.txt")), {}),
        ("s3:GetObject", arn(store, OTHER_WORKSPACE.key("data/train.jsonl")), {}),
        ("s3:GetObject", arn(store, FINAL.key("adapter_model.safetensors")), {}),
        ("s3:GetObject", arn(store, keys.job_log_key(JOB)), {}),
        ("s3:GetObject", arn(store, VOLUME.value.removesuffix("/")), {}),
        ("s3:GetObject", f"arn:aws:s3:::{store.bucket}/secrets.txt", {}),
        ("s3:GetObject", f"arn:aws:s3:::another-bucket/{root}{VOLUME.key('a.txt')}", {}),
        # Listings anywhere else: the root, the whole bucket, the sibling, the folder without
        # its slash (which would list `vol_10` too), another workspace, the jobs.
        ("s3:ListBucket", arn(store), listing(store, None)),
        ("s3:ListBucket", arn(store), listing(store, "")),
        ("s3:ListBucket", arn(store), listing(store, root)),
        ("s3:ListBucket", arn(store), listing(store, root + "workspaces/ws_a/")),
        ("s3:ListBucket", arn(store), listing(store, root + VOLUME.value.removesuffix("/"))),
        ("s3:ListBucket", arn(store), listing(store, root + SIBLING.value)),
        ("s3:ListBucket", arn(store), listing(store, root + OTHER_WORKSPACE.value)),
        ("s3:ListBucket", arn(store), listing(store, root + JOB.value)),
        ("s3:ListBucket", "arn:aws:s3:::another-bucket", listing(store, root + VOLUME.value)),
        # Versions and multipart listings, even of the volume itself.
        ("s3:ListBucketVersions", arn(store), listing(store, root + VOLUME.value)),
        ("s3:GetObjectVersion", own, {}),
        ("s3:ListBucketMultipartUploads", arn(store), listing(store, root + VOLUME.value)),
        ("s3:ListMultipartUploadParts", own, {}),
        # Every write and delete, on its own objects too (DeleteObjects is s3:DeleteObject for
        # each key it names).
        ("s3:PutObject", own, {}),
        ("s3:PutObject", arn(store, VOLUME.key("new.txt")), {}),
        ("s3:DeleteObject", own, {}),
        ("s3:DeleteObjectVersion", own, {}),
        ("s3:AbortMultipartUpload", own, {}),
        ("s3:PutObjectAcl", own, {}),
        ("s3:PutObjectTagging", own, {}),
        ("s3:RestoreObject", own, {}),
        ("s3:GetObjectAcl", own, {}),
        ("s3:PutBucketPolicy", arn(store), {}),
        ("s3:DeleteBucket", arn(store), {}),
        # The key: used through S3 to decrypt, nothing else, and no other key.
        ("kms:Decrypt", KMS_KEY, {}),
        ("kms:Decrypt", OTHER_KMS_KEY, VIA_S3),
        ("kms:GenerateDataKey", KMS_KEY, VIA_S3),
        ("kms:Encrypt", KMS_KEY, VIA_S3),
    ]
    return [("Allowed", *case) for case in allowed] + [("denied", *case) for case in denied]


def assert_confined(policy: dict, cases: list[tuple[str, str, str, dict]]) -> None:
    decisions = evaluate(policy, [case[1:] for case in cases])
    wrong = [
        f"{action} {resource} {context or ''}: {decision}, expected {expected}"
        for (expected, action, resource, context), decision in zip(cases, decisions, strict=True)
        if (decision == "Allowed") != (expected == "Allowed")
    ]
    assert not wrong, "\n".join(wrong)


def test_a_workers_read_credentials_reach_its_volume_and_nothing_else(s3):
    sent = sent_policies(s3)
    files = [VOLUME.key("a.txt"), VOLUME.key("data/train.jsonl")]
    credentials, where = s3.read_grant(VOLUME.value, files, ttl=1800)  # what volume sync asks
    assert credentials["kind"] == "s3" and where[files[0]] == {"key": s3.root + files[0]}
    [policy] = sent
    assert_confined(policy, read_cases(s3))


def test_without_a_kms_key_the_credentials_use_no_key(s3, settings):
    settings.VERI_STORE_KMS_KEY_ARN = ""
    sent = sent_policies(s3)
    s3.read_grant(VOLUME.value, [VOLUME.key("a.txt")], ttl=1800)
    [policy] = sent
    decisions = evaluate(
        policy, [("kms:Decrypt", KMS_KEY, VIA_S3), ("kms:GenerateDataKey", KMS_KEY, VIA_S3)]
    )
    assert decisions == ["ImplicitlyDenied"] * 2


def test_the_evaluator_tells_a_policy_that_leaks(s3):
    """The cases catch a regression: the same policy without the folder's trailing slash (the
    classic `vol_1*` that reaches `vol_10/`) lets the sibling and its listing through."""
    sent = sent_policies(s3)
    s3.read_grant(VOLUME.value, [VOLUME.key("a.txt")], ttl=1800)
    slashless = json.loads(json.dumps(sent[0]).replace(f"{VOLUME.value}*", f"{VOLUME.value[:-1]}*"))
    assert slashless != sent[0]
    sibling = [
        ("s3:GetObject", arn(s3, SIBLING.key("a.txt")), {}),
        ("s3:ListBucket", arn(s3), listing(s3, s3.root + SIBLING.value)),
    ]
    assert evaluate(sent[0], sibling) == ["ImplicitlyDenied"] * 2
    assert evaluate(slashless, sibling) == ["Allowed"] * 2
