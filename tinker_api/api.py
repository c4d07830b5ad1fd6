"""`/api/v1/…`: the routes the official `tinker` SDK calls, as it calls them (see
docs/architecture/tinker.md for the wire). The client sends its key as `X-API-Key: tml-…`.
Errors keep Veri's `{"error": {...}}` body; what the client does with them is its status code's
business (401 → AuthenticationError, 404 → NotFoundError, 400 → BadRequestError)."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from tinker_api import selectors, wire
from tinker_api.models import (
    SAMPLER_SEQ,
    CheckpointKind,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerKey,
)
from tinker_api.services import (
    base_models,
    checkpoints,
    keys,
    sampling,
    sessions,
    stability,
    usage,
)
from veri.api import ValidatingView
from veri.errors import VeriError

PROTOBUF = "application/x-protobuf"
# What the client reads from /client/config: no JWT exchange (Veri takes the key itself),
# uncompressed protobuf bodies of forward_backward chunks that fit under Veri's body limit, and
# plain httpx (no pyqwest transport), a 402 (no funds, a spent budget) raised as BillingError
# at its second answer rather than the loop paused for an hour; the rest as the SDK's defaults.
CLIENT_CONFIG = {
    "billing_exception_max_pause_duration_sec": 0,
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
DYNAMIC_CONFIG = {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


class Unsupported(VeriError):
    code = "unsupported"


class TinkerKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[None, TinkerKey] | None:
        raw = request.headers.get("X-API-Key", "").strip()
        if not raw:
            return None
        key = keys.authenticate_key(raw=raw)
        if key is None:
            raise exceptions.AuthenticationFailed("This Tinker key is not valid or was revoked.")
        return None, key

    def authenticate_header(self, request: Request) -> str:
        return "X-API-Key"  # makes DRF answer 401 (not 403) when no key is sent


class AnswerJson(DefaultContentNegotiation):
    """The client asks for protobuf (`Accept`) where it can read either: JSON it gets, unless a
    view answers protobuf itself."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class HasTinkerKey(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, TinkerKey)


@extend_schema(exclude=True)  # the Tinker wire is the SDK's, documented in its own guide
class TinkerView(ValidatingView):
    authentication_classes = [TinkerKeyAuthentication]
    permission_classes = [HasTinkerKey]
    content_negotiation_class = AnswerJson

    @property
    def workspace(self):
        return self.request.auth.workspace

    def model(self, model_id: str):
        return selectors.get_model(workspace=self.workspace, model_id=model_id)


class HealthView(TinkerView):
    authentication_classes, permission_classes = [], []

    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})


class ClientConfigView(TinkerView):
    def post(self, request: Request) -> Response:
        limit = settings.VERI_MAX_JSON_BYTES
        # The client estimates a chunk's size before encoding it: keep well under the limit.
        return Response(CLIENT_CONFIG | {"fwdbwd_max_chunk_bytes_count": limit // 2})


class DynamicConfigView(TinkerView):
    def post(self, request: Request) -> Response:
        return Response(DYNAMIC_CONFIG)


class TelemetryView(TinkerView):
    def post(self, request: Request) -> Response:
        return Response({"status": "accepted"})  # not kept: Veri has its own events


class CapabilitiesView(TinkerView):
    def get(self, request: Request) -> Response:
        names = base_models.supported_models(workspace=self.workspace)
        return Response(
            {
                "supported_models": [
                    {"model_name": name, "trainable": True, "sampleable": True} for name in names
                ]
            }
        )


class CreateSessionView(TinkerView):
    class Input(serializers.Serializer):
        tags = serializers.ListField(child=serializers.CharField(max_length=200), default=list)
        user_metadata = serializers.DictField(required=False, allow_null=True)
        sdk_version = serializers.CharField(max_length=40, allow_blank=True, default="")

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        session = sessions.create_session(
            workspace=self.workspace,
            sdk_version=data["sdk_version"],
            tags=data["tags"],
            user_metadata=data.get("user_metadata") or {},
        )
        return Response({"type": "create_session", "session_id": session.public_id})


class SessionHeartbeatView(TinkerView):
    class Input(serializers.Serializer):
        session_id = serializers.CharField(max_length=40)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        session = selectors.get_session(workspace=self.workspace, session_id=data["session_id"])
        if not sessions.heartbeat(session=session):
            body = VeriError("This session has ended.", code="session_ended").as_body()
            return Response(body, status=410)  # the client stops heartbeating
        return Response({"type": "session_heartbeat"})


class SessionFinishView(TinkerView):
    """`ServiceClient.close()`, and leaving `with ServiceClient() as …`: the session ends as an
    idle one does, each live model's state saved first (the catalog's `session_ended`)."""

    class Input(serializers.Serializer):
        reason = serializers.DictField(required=False, allow_null=True)
        detail = serializers.CharField(
            max_length=2000, required=False, allow_null=True, allow_blank=True
        )

    def post(self, request: Request, session_id: str) -> Response:
        data = self.validated(self.Input, request.data)
        session = selectors.get_session(workspace=self.workspace, session_id=session_id)
        how = str((data.get("reason") or {}).get("type") or "closed")[:40]
        sessions.end_session(session=session, reason=f"The client closed the session ({how}).")
        return Response({"type": "finish_session"})


class LoraIn(serializers.Serializer):
    rank = serializers.IntegerField(min_value=1, max_value=256)
    seed = serializers.IntegerField(required=False, allow_null=True)
    train_unembed = serializers.BooleanField(default=True)
    train_mlp = serializers.BooleanField(default=True)
    train_attn = serializers.BooleanField(default=True)


def _optimizer_is_adam(config: dict | None) -> None:
    if config and config.get("type", "adamw") != "adamw":
        raise Unsupported(
            f"Optimizer {config.get('type')!r} is not supported; Veri trains with AdamW.",
            field="optimizer_config",
        )


class CreateModelView(TinkerView):
    class Input(serializers.Serializer):
        session_id = serializers.CharField(max_length=40)
        model_seq_id = serializers.IntegerField(min_value=0, max_value=10_000)
        base_model = serializers.CharField(max_length=300)
        user_metadata = serializers.DictField(required=False, allow_null=True)
        lora_config = LoraIn(required=False, allow_null=True)
        optimizer_config = serializers.DictField(required=False, allow_null=True)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        if not data.get("lora_config"):
            raise Unsupported("Only LoRA training is supported: pass a LoRA rank.")
        _optimizer_is_adam(data.get("optimizer_config"))
        session = selectors.get_session(workspace=self.workspace, session_id=data["session_id"])
        operation = sessions.create_model(
            session=session,
            model_seq_id=data["model_seq_id"],
            base_model=data["base_model"],
            lora=dict(data["lora_config"]),
            user_metadata=data.get("user_metadata") or {},
        )
        return Response({"request_id": operation.request_id, "model_id": operation.model.model_id})


class GetInfoView(TinkerView):
    class Input(serializers.Serializer):
        model_id = serializers.CharField(max_length=80)

    def post(self, request: Request) -> Response:
        model = self.model(self.validated(self.Input, request.data)["model_id"])
        return Response(
            {
                "type": "get_info",
                "model_id": model.model_id,
                "model_data": {"arch": None, "model_name": model.base_model, "tokenizer_id": None},
                "is_lora": True,
                "lora_rank": model.lora["rank"],
                "model_name": model.base_model,
            }
        )


def _future(operation) -> Response:
    return Response({"request_id": operation.request_id, "model_id": operation.model.model_id})


class ForwardBackwardView(TinkerView):
    """The client sends this one as protobuf (`application/x-protobuf`)."""

    def post(self, request: Request) -> Response:
        if request.content_type != PROTOBUF:
            raise VeriError(f"forward_backward takes {PROTOBUF}, as the tinker SDK sends it.")
        if request.headers.get("Content-Encoding", "identity") != "identity":
            raise Unsupported("Send forward_backward uncompressed (client config says so).")
        decoded = wire.decode_forward_backward(request.body)
        model = self.model(decoded["model_id"])
        if not decoded["data"]:
            raise VeriError("No data.", field="data")
        kind = OpKind.FORWARD if decoded["forward_only"] else OpKind.FORWARD_BACKWARD
        data = stability.prepare(model=model, loss_fn=decoded["loss_fn"], data=decoded["data"])
        payload = {k: decoded[k] for k in ("loss_fn", "loss_fn_config")} | {"data": data}
        operation = sessions.enqueue(
            model=model, seq_id=decoded["seq_id"], kind=kind, payload=payload
        )
        usage.count_tokens(operation=operation, data=decoded["data"])
        return _future(operation)


class AdamIn(serializers.Serializer):
    learning_rate = serializers.FloatField(min_value=0, default=1e-4)
    beta1 = serializers.FloatField(min_value=0, max_value=1, default=0.9)
    beta2 = serializers.FloatField(min_value=0, max_value=1, default=0.95)
    eps = serializers.FloatField(min_value=0, default=1e-12)
    weight_decay = serializers.FloatField(min_value=0, default=0.0)
    grad_clip_norm = serializers.FloatField(default=0.0)


class OptimStepView(TinkerView):
    class Input(serializers.Serializer):
        model_id = serializers.CharField(max_length=80)
        seq_id = serializers.IntegerField(min_value=1)
        adam_params = AdamIn(required=False)
        optimizer_params = serializers.DictField(required=False)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        if "adam_params" not in data:
            raise Unsupported("Only Adam steps are supported (AdamParams).", field="optim_params")
        model = self.model(data["model_id"])
        operation = sessions.enqueue(
            model=model,
            seq_id=data["seq_id"],
            kind=OpKind.OPTIM_STEP,
            payload={"adam_params": dict(data["adam_params"])},
        )
        return _future(operation)


class SaveIn(serializers.Serializer):
    """`save_state`'s and `save_weights_for_sampler`'s body: `path` is the save's name."""

    model_id = serializers.CharField(max_length=80)
    seq_id = serializers.IntegerField(min_value=1)
    path = serializers.CharField(max_length=100, required=False, allow_null=True)


class SaveWeightsView(TinkerView):
    Input = SaveIn

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        model = self.model(data["model_id"])
        return _future(checkpoints.save(model=model, seq_id=data["seq_id"], name=data.get("path")))


class LoadWeightsView(TinkerView):
    """On a model (`model_id`, `seq_id`: `load_state`), or as a new model's creation
    (`session_id`, `model_seq_id`: `create_training_client_from_state`)."""

    class Input(serializers.Serializer):
        model_id = serializers.CharField(max_length=80, required=False, allow_null=True)
        seq_id = serializers.IntegerField(min_value=1, required=False, allow_null=True)
        session_id = serializers.CharField(max_length=40, required=False, allow_null=True)
        model_seq_id = serializers.IntegerField(min_value=0, max_value=10_000, required=False)
        path = serializers.CharField(max_length=300)
        optimizer = serializers.BooleanField()
        optimizer_config = serializers.DictField(required=False, allow_null=True)
        user_metadata = serializers.DictField(required=False, allow_null=True)
        weights_access_token = serializers.CharField(required=False, allow_null=True)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        if data.get("weights_access_token"):
            raise Unsupported("Loading another account's checkpoint is not supported.")
        _optimizer_is_adam(data.get("optimizer_config"))
        if data.get("model_id"):
            if not data.get("seq_id"):
                raise VeriError("seq_id goes with model_id.", field="seq_id")
            operation = checkpoints.load(
                model=self.model(data["model_id"]),
                seq_id=data["seq_id"],
                path=data["path"],
                optimizer=data["optimizer"],
            )
            return _future(operation)
        if not data.get("session_id") or data.get("model_seq_id") is None:
            raise VeriError("Send model_id and seq_id, or session_id and model_seq_id.")
        session = selectors.get_session(workspace=self.workspace, session_id=data["session_id"])
        checkpoint = checkpoints.loadable(
            workspace=self.workspace, path=data["path"], optimizer=data["optimizer"]
        )
        operation = sessions.create_model(
            session=session,
            model_seq_id=data["model_seq_id"],
            base_model=checkpoint.model.base_model,
            lora=checkpoint.model.lora,
            user_metadata=data.get("user_metadata") or {},
            load=checkpoints.load_payload(checkpoint, optimizer=data["optimizer"]),
        )
        return _future(operation)


class SaveWeightsForSamplerView(TinkerView):
    """`path` (a name): a sampler checkpoint; none: a sampler of these weights
    (`save_weights_and_get_sampling_client`)."""

    Input = SaveIn

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        model = self.model(data["model_id"])
        operation = sampling.save_for_sampler(
            model=model, seq_id=data["seq_id"], name=data.get("path")
        )
        return _future(operation)


class CreateSamplingSessionView(TinkerView):
    class Input(serializers.Serializer):
        session_id = serializers.CharField(max_length=40)
        model_path = serializers.CharField(max_length=300, required=False, allow_null=True)
        base_model = serializers.CharField(max_length=300, required=False, allow_null=True)
        sampling_session_seq_id = serializers.IntegerField(min_value=0, max_value=10_000, default=0)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        session = selectors.get_session(workspace=self.workspace, session_id=data["session_id"])
        if data.get("model_path"):
            sampler = sampling.path_sampler(
                session=session,
                path=data["model_path"],
                sampling_seq_id=data["sampling_session_seq_id"],
            )
        elif data.get("base_model"):
            sampler = sampling.base_sampler(
                session=session,
                base_model=data["base_model"],
                sampling_seq_id=data["sampling_session_seq_id"],
            )
        else:
            raise VeriError("Send model_path or base_model.", field="model_path")
        return Response({"type": "create_sampling_session", "sampling_session_id": sampler})


class SamplerView(TinkerView):
    def get(self, request: Request, sampler_id: str) -> Response:
        save = sampling.get_sampler(workspace=self.workspace, sampler=sampler_id)
        return Response(
            {
                "sampler_id": sampler_id,
                "base_model": save.model.base_model,
                "model_path": sampling.model_path(save),
            }
        )


class SamplingParamsIn(serializers.Serializer):
    max_tokens = serializers.IntegerField(
        min_value=1, max_value=sampling.MAX_TOKENS, allow_null=True, default=16
    )
    seed = serializers.IntegerField(required=False, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)
    temperature = serializers.FloatField(min_value=0, max_value=100, default=1.0)
    top_k = serializers.IntegerField(min_value=-1, default=-1)
    top_p = serializers.FloatField(min_value=0, max_value=1, default=1.0)

    def validate_stop(self, stop):
        if stop is None or isinstance(stop, str):
            return stop
        if isinstance(stop, list) and len(stop) <= 16:
            if all(isinstance(s, str) and s for s in stop):
                return stop
            if all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in stop):
                return stop
        raise serializers.ValidationError("stop is a string, strings or token ids (up to 16).")


class AsampleView(TinkerView):
    class Input(serializers.Serializer):
        sampling_session_id = serializers.CharField(max_length=120)
        seq_id = serializers.IntegerField(min_value=0)
        num_samples = serializers.IntegerField(
            min_value=1, max_value=sampling.MAX_SAMPLES, default=1
        )
        prompt = serializers.DictField()
        sampling_params = SamplingParamsIn()
        prompt_logprobs = serializers.BooleanField(required=False, allow_null=True)
        prompt_logprobs_last_n = serializers.IntegerField(required=False, allow_null=True)
        topk_prompt_logprobs = serializers.IntegerField(default=0)
        topk_sample_logprobs = serializers.IntegerField(default=0)
        prompt_alt_tokens_k = serializers.IntegerField(default=0)
        target_prompt_logprobs = serializers.DictField(required=False, allow_null=True)
        record_stability_info = serializers.BooleanField(required=False, allow_null=True)

    def post(self, request: Request) -> Response:
        data = self.validated(self.Input, request.data)
        asked = [
            name for name in ("target_prompt_logprobs", "prompt_logprobs_last_n") if data.get(name)
        ] + [
            name
            for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")
            if data[name]
        ]
        if asked:
            raise Unsupported(f"Sampling with {', '.join(asked)} is not supported yet.")
        params = dict(data["sampling_params"])
        params["max_tokens"] = params["max_tokens"] or 16
        payload = {
            "tokens": wire.prompt_tokens(data["prompt"]),
            "num_samples": data["num_samples"],
            "sampling_params": params,
        }
        if data.get("prompt_logprobs"):  # each prompt token's, the first's None
            payload["prompt_logprobs"] = True
        save = sampling.get_sampler(workspace=self.workspace, sampler=data["sampling_session_id"])
        operation = sampling.sample(
            save=save, payload=payload, record=bool(data.get("record_stability_info"))
        )
        ids = [f"{operation.request_id}:{index}" for index in range(data["num_samples"])]
        return Response(
            {
                "request_id": operation.request_id,
                "model_id": save.model.model_id,
                "sample_sequence_ids": ids,
            }
        )


class RetrieveFutureView(TinkerView):
    class Input(serializers.Serializer):
        request_id = serializers.CharField(max_length=40)
        allow_metadata_only = serializers.BooleanField(default=False)

    def post(self, request: Request):
        data = self.validated(self.Input, request.data)
        operation = selectors.get_operation(workspace=self.workspace, request_id=data["request_id"])
        operation = selectors.wait_finished(
            operation=operation, wait=settings.VERI_TINKER_WAIT_SECONDS
        )
        if operation.status == OpStatus.FAILED:
            return Response({"error": operation.error, "category": operation.error_category})
        if operation.status not in (OpStatus.DONE, OpStatus.FAILED):
            sessions.check_machine(model=operation.model)  # a lost worker fails it next poll
            return Response(
                {"type": "try_again", "request_id": operation.request_id, "queue_state": "active"}
            )
        if operation.kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
            body = wire.encode_forward_backward_output(operation.result)
            return HttpResponse(body, content_type=PROTOBUF)
        if operation.kind == OpKind.SAMPLE:
            body = wire.encode_sample_response(operation.result)
            return HttpResponse(body, content_type=PROTOBUF)
        if operation.kind == OpKind.SAVE_FOR_SAMPLER:
            return Response(sampling.saved_answer(operation))
        model_id = operation.model.model_id
        load = operation.payload.get("load") if operation.kind == OpKind.CREATE else None
        if operation.kind == OpKind.LOAD_WEIGHTS or load:
            path = (load or operation.payload)["path"]
            return Response({"type": "load_weights", "path": path, "model_id": model_id})
        if operation.kind == OpKind.CREATE:
            return Response({"type": "create_model", "model_id": model_id})
        return Response(operation.result)


@csrf_exempt
def unsupported(request: HttpRequest, path: str = "") -> JsonResponse:
    """Whatever else the client may call: a clear error it raises (400: BadRequestError), never
    a 404 page or a 500."""
    error = Unsupported(
        f"Veri's Tinker API does not support /api/v1/{path} yet; its guide 'Coming from "
        "Tinker' (docs/user-guide/tinker.md) lists what it supports."
    )
    return JsonResponse(error.as_body(), status=400)


# The rest client's listing routes (`tinker.ServiceClient().create_rest_client()`): training
# runs are the workspace's models, their checkpoints the saved states ("training") and named
# sampler weights ("sampler"); Veri has no external weights yet, nor public checkpoints.
CHECKPOINT_TYPES = {CheckpointKind.STATE: "training", CheckpointKind.SAMPLER: "sampler"}


def _checkpoint_out(checkpoint) -> dict:
    return {
        "checkpoint_id": f"{checkpoint.kind}/{checkpoint.name}",
        "checkpoint_type": CHECKPOINT_TYPES[checkpoint.kind],
        "time": checkpoint.created_at,
        "tinker_path": checkpoints.tinker_path(checkpoint),
        "size_bytes": checkpoint.size_bytes,
        "public": False,
    }


def _run_out(model) -> dict:
    saved = [c for c in model.checkpoints.all() if c.files is not None]

    def last(kind: str) -> dict | None:
        of_kind = [c for c in saved if c.kind == kind]
        newest = max(of_kind, key=lambda c: (c.created_at, c.pk), default=None)
        return _checkpoint_out(newest) if newest else None

    return {
        "training_run_id": model.model_id,
        "base_model": model.base_model,
        "model_owner": model.workspace.public_id,
        "is_lora": True,
        "corrupted": model.status == ModelStatus.FAILED,
        "lora_rank": model.lora["rank"],
        "last_request_time": model.last_seen_at or model.created_at,
        "last_checkpoint": last(CheckpointKind.STATE),
        "last_sampler_checkpoint": last(CheckpointKind.SAMPLER),
        "user_metadata": {str(k): str(v) for k, v in model.user_metadata.items()},
    }


class PageIn(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=1000, default=20)
    offset = serializers.IntegerField(min_value=0, default=0)


def _page(rows, page: dict) -> tuple[list, dict]:
    offset, limit = page["offset"], page["limit"]
    cursor = {"offset": offset, "limit": limit, "total_count": rows.count()}
    return list(rows[offset : offset + limit]), cursor


class TrainingRunsView(TinkerView):
    def get(self, request: Request) -> Response:
        rows = (
            selectors.list_models(workspace=self.workspace)
            .filter(model_seq_id__lt=SAMPLER_SEQ)  # a sampling-only model trains nothing
            .select_related("workspace")
            .prefetch_related("checkpoints__model")
        )
        runs, cursor = _page(rows, self.validated(PageIn, request.query_params))
        return Response({"training_runs": [_run_out(m) for m in runs], "cursor": cursor})


class TrainingRunView(TinkerView):
    def get(self, request: Request, model_id: str) -> Response:
        return Response(_run_out(self.model(model_id)))


class RunCheckpointsView(TinkerView):
    def get(self, request: Request, model_id: str) -> Response:
        model = self.model(model_id)
        rows = selectors.list_checkpoints(workspace=self.workspace).filter(model=model)
        return Response({"checkpoints": [_checkpoint_out(c) for c in rows]})


class UserCheckpointsView(TinkerView):
    def get(self, request: Request) -> Response:
        page = self.validated(PageIn, {"limit": 100} | request.query_params.dict())
        rows, cursor = _page(selectors.list_checkpoints(workspace=self.workspace), page)
        return Response({"checkpoints": [_checkpoint_out(c) for c in rows], "cursor": cursor})


class CheckpointView(TinkerView):
    def delete(self, request: Request, model_id: str, checkpoint_id: str) -> Response:
        checkpoint = selectors.get_checkpoint(
            workspace=self.workspace, model_id=model_id, checkpoint_id=checkpoint_id
        )
        checkpoints.delete(checkpoint)
        return Response(status=204)


class CheckpointArchiveView(TinkerView):
    """The LoRA adapter as a tar archive: a redirect to a short-lived URL of the store."""

    def get(self, request: Request, model_id: str, checkpoint_id: str) -> HttpResponse:
        checkpoint = selectors.get_checkpoint(
            workspace=self.workspace, model_id=model_id, checkpoint_id=checkpoint_id
        )
        url = request.build_absolute_uri(checkpoints.archive_url(checkpoint))
        return HttpResponseRedirect(url)


class WeightsInfoView(TinkerView):
    class Input(serializers.Serializer):
        tinker_path = serializers.CharField(max_length=300)

    def post(self, request: Request) -> Response:
        path = self.validated(self.Input, request.data)["tinker_path"]
        kinds = tuple(CheckpointKind)
        model = checkpoints.resolve(workspace=self.workspace, path=path, kinds=kinds).model
        lora = model.lora
        return Response(
            {
                "base_model": model.base_model,
                "is_lora": True,
                "lora_rank": lora["rank"],
                "train_unembed": lora.get("train_unembed", True),
                "train_mlp": lora.get("train_mlp", True),
                "train_attn": lora.get("train_attn", True),
            }
        )


class SessionsView(TinkerView):
    def get(self, request: Request) -> Response:
        rows = selectors.list_sessions(workspace=self.workspace)
        sessions_page, cursor = _page(rows, self.validated(PageIn, request.query_params))
        return Response({"sessions": [s.public_id for s in sessions_page], "cursor": cursor})


class SessionView(TinkerView):
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.get_session(workspace=self.workspace, session_id=session_id)
        return Response(
            {
                "training_run_ids": list(
                    session.models.order_by("model_seq_id").values_list("model_id", flat=True)
                ),
                "sampler_ids": [],
                "user_metadata": {str(k): str(v) for k, v in session.user_metadata.items()},
            }
        )
