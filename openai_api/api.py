"""The OpenAI-compatible routes: files, fine-tuning jobs (events, checkpoints, cancel, pause,
resume), models and graders, in OpenAI's shapes, errors and `after`-cursor pagination. Thin:
each view validates, calls a service and shapes the answer (`objects`)."""

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from openai_api import errors, objects, selectors
from openai_api.models import File, FineTuningJob
from openai_api.services import files as file_services
from openai_api.services import jobs as job_services
from serving import selectors as serving_selectors
from veri.api import WorkspaceView, query_int
from veri.errors import NotFound, VeriError
from worker import graders

# OpenAI's own API reference is these routes' contract (and the `openai` client their test):
# they are left out of Veri's schema, whose error shape they do not speak.
SCHEMA = extend_schema(exclude=True)


class OpenAIView(WorkspaceView):
    def get_exception_handler(self):
        return errors.exception_handler


def _page(rows: list, data: list[dict], *, has_more: bool) -> Response:
    return Response(
        {
            "object": "list",
            "data": data,
            "has_more": has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


def _after(request: Request, queryset, *, default_limit: int, max_limit: int, order: str = "desc"):
    """One page by `after` (an id of the list) and `limit`, newest first unless `order=asc`."""
    limit = query_int(request, "limit", default_limit, low=1, high=max_limit)
    ordered = queryset.order_by("pk" if order == "asc" else "-pk")
    if after := request.query_params.get("after"):
        anchor = queryset.filter(public_id=after).values_list("pk", flat=True).first()
        if anchor is None:
            raise VeriError(f"after {after[:60]!r} is not an id of this list.", field="after")
        ordered = ordered.filter(**{"pk__gt" if order == "asc" else "pk__lt": anchor})
    rows = list(ordered[: limit + 1])
    return rows[:limit], len(rows) > limit


@SCHEMA
class FilesView(OpenAIView):
    def get(self, request: Request) -> Response:
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise VeriError("order must be asc or desc.", field="order")
        found = selectors.list_files(
            workspace=self.workspace, purpose=request.query_params.get("purpose")
        )
        rows, more = _after(request, found, default_limit=10_000, max_limit=10_000, order=order)
        return _page(rows, [objects.file_object(f) for f in rows], has_more=more)

    def post(self, request: Request) -> Response:
        file = file_services.create_file(
            workspace=self.workspace,
            upload=request.FILES.get("file"),
            purpose=request.data.get("purpose"),
        )
        return Response(objects.file_object(file))


@SCHEMA
class FileView(OpenAIView):
    def get(self, request: Request, file_id: str) -> Response:
        file = selectors.get_file(workspace=self.workspace, file_id=file_id)
        return Response(objects.file_object(file))

    def delete(self, request: Request, file_id: str) -> Response:
        file = selectors.get_file(workspace=self.workspace, file_id=file_id)
        file_services.delete_file(file=file)
        return Response({"id": file_id, "object": "file", "deleted": True})


@SCHEMA
class FileContentView(OpenAIView):
    def perform_content_negotiation(self, request, force=False):
        # The client asks for `application/binary`: the bytes go back whatever it accepts.
        return super().perform_content_negotiation(request, force=True)

    def get(self, request: Request, file_id: str) -> HttpResponse:
        file = selectors.get_file(workspace=self.workspace, file_id=file_id)
        kind = "text/csv" if file.purpose == File.Purpose.FINE_TUNE_RESULTS else None
        return HttpResponse(
            file_services.file_content(file=file), content_type=kind or "application/octet-stream"
        )


def _metadata_filter(request: Request) -> dict[str, str]:
    return {
        key[len("metadata[") : -1]: value
        for key, value in request.query_params.items()
        if key.startswith("metadata[") and key.endswith("]") and len(key) > len("metadata[]")
    }


def _job_answer(ft: FineTuningJob) -> Response:
    return Response(objects.job_object(job_services.ensure_result_file(ft=ft)))


@SCHEMA
class JobsView(OpenAIView):
    def get(self, request: Request) -> Response:
        found = selectors.list_jobs(workspace=self.workspace, metadata=_metadata_filter(request))
        rows, more = _after(request, found, default_limit=20, max_limit=100)
        return _page(rows, [objects.job_object(ft) for ft in rows], has_more=more)

    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise VeriError("The body must be a JSON object.")
        ft = job_services.create_job(workspace=self.workspace, body=dict(request.data))
        return Response(objects.job_object(ft))


class JobScoped(OpenAIView):
    def ft(self, job_id: str) -> FineTuningJob:
        return job_services.get_job(workspace=self.workspace, job_id=job_id)


@SCHEMA
class JobView(JobScoped):
    def get(self, request: Request, job_id: str) -> Response:
        return _job_answer(self.ft(job_id))


@SCHEMA
class CancelView(JobScoped):
    def post(self, request: Request, job_id: str) -> Response:
        return _job_answer(job_services.cancel(ft=self.ft(job_id)))


@SCHEMA
class PauseView(JobScoped):
    def post(self, request: Request, job_id: str) -> Response:
        return _job_answer(job_services.pause(ft=self.ft(job_id)))


@SCHEMA
class ResumeView(JobScoped):
    def post(self, request: Request, job_id: str) -> Response:
        return _job_answer(job_services.resume(ft=self.ft(job_id)))


def _list_after(request: Request, items: list[dict], *, default_limit: int) -> Response:
    """A page of an already ordered list of objects, by `after` (one of their ids)."""
    limit = query_int(request, "limit", default_limit, low=1, high=1000)
    if after := request.query_params.get("after"):
        ids = [item["id"] for item in items]
        if after not in ids:
            raise VeriError(f"after {after[:60]!r} is not an id of this list.", field="after")
        items = items[ids.index(after) + 1 :]
    return _page(items, items[:limit], has_more=len(items) > limit)


@SCHEMA
class EventsView(JobScoped):
    def get(self, request: Request, job_id: str) -> Response:
        ft = self.ft(job_id)
        limit = query_int(request, "limit", 20, low=1, high=1000)
        after = request.query_params.get("after")
        items, has_more = selectors.event_page(ft=ft, after=after, limit=limit)
        data = [objects.event_object(ft, item) for item in items]
        return _page(data, data, has_more=has_more)


@SCHEMA
class CheckpointsView(JobScoped):
    def get(self, request: Request, job_id: str) -> Response:
        ft = self.ft(job_id)
        items = [
            objects.checkpoint_object(ft, checkpoint, metrics)
            for checkpoint, metrics in selectors.checkpoints(ft=ft)
        ]
        return _list_after(request, items, default_limit=10)


@SCHEMA
class ModelsView(OpenAIView):
    def get(self, request: Request) -> Response:
        data = [
            objects.model_object(name, created=None, owned_by="veri")
            for name in settings.VERI_BASE_MODELS
        ] + [
            objects.model_object(
                objects.fine_tuned_model(ft), created=ft.job.finished_at, owned_by=ft.workspace.name
            )
            for ft in selectors.succeeded_jobs(workspace=self.workspace).order_by("-pk")
        ]
        # What the workspace's deployments serve besides: a base outside the list, a checkpoint.
        listed = {m["id"] for m in data}
        data += [
            objects.model_object(name, created=deployment.created_at, owned_by=self.workspace.name)
            for name, deployment in serving_selectors.served_models(
                workspace=self.workspace
            ).items()
            if name not in listed
        ]
        return Response({"object": "list", "data": data})


@SCHEMA
class ModelView(OpenAIView):
    def get(self, request: Request, model: str) -> Response:
        if model in settings.VERI_BASE_MODELS:
            return Response(objects.model_object(model, created=None, owned_by="veri"))
        try:
            ft = selectors.get_fine_tuned(workspace=self.workspace, model=model)
        except NotFound:  # a name only a deployment answers to: a base, a checkpoint
            deployment = serving_selectors.served_models(workspace=self.workspace).get(model)
            if deployment is None:
                raise
            return Response(
                objects.model_object(
                    model, created=deployment.created_at, owned_by=self.workspace.name
                )
            )
        return Response(
            objects.model_object(model, created=ft.job.finished_at, owned_by=ft.workspace.name)
        )

    def delete(self, request: Request, model: str) -> Response:
        ft = selectors.get_fine_tuned(workspace=self.workspace, model=model)
        job_services.delete_model(ft=ft)
        return Response({"id": model, "object": "model", "deleted": True})


def _grader(request: Request) -> dict:
    grader = request.data.get("grader") if isinstance(request.data, dict) else None
    if not isinstance(grader, dict):
        raise VeriError("grader is required: a grader object.", field="grader")
    try:
        graders.check_grader(grader)
    except graders.GraderError as exc:
        raise VeriError(exc.message, field=exc.param, code="invalid_grader") from None
    return grader


@SCHEMA
class GraderValidateView(OpenAIView):
    def post(self, request: Request) -> Response:
        return Response({"grader": _grader(request)})


@SCHEMA
class GraderRunView(OpenAIView):
    def post(self, request: Request) -> Response:
        grader = _grader(request)
        sample, item = request.data.get("model_sample"), request.data.get("item") or {}
        if not isinstance(sample, str):
            raise VeriError("model_sample must be the model's output text.", field="model_sample")
        if not isinstance(item, dict):
            raise VeriError("item must be an object (a row of the dataset).", field="item")
        return Response(job_services.run_grader(grader=grader, model_sample=sample, item=item))
