"""`/v1/evaluations`: compare two deployed models on a held-out file with a grader. Thin:
validate, call a service, serialize."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from serving import selectors
from serving.models import Evaluation, EvaluationSample
from serving.services import evaluations as services
from veri.api import WorkspaceView, list_schema, paginate

MAX_NAME = 500


class EvaluationOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    error = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField()
    samples_total = serializers.IntegerField(source="sample_count")
    samples_answered = serializers.IntegerField(source="answered_count")
    samples_scored = serializers.IntegerField(source="scored_count")

    class Meta:
        model = Evaluation
        fields = [
            "id",
            "status",
            "model",
            "baseline",
            "file",
            "grader",
            "reward_source",
            "max_tokens",
            "temperature",
            "error",
            "summary",
            "samples_total",
            "samples_answered",
            "samples_scored",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def get_error(self, evaluation: Evaluation) -> dict | None:
        if not evaluation.error_code:
            return None
        return {
            "code": evaluation.error_code,
            "message": evaluation.error_message,
            "hint": services.ERRORS.get(evaluation.error_code, ""),
        }

    def get_summary(self, evaluation: Evaluation) -> dict | None:
        return evaluation.summary or None


class EvaluationSampleOut(serializers.ModelSerializer):
    class Meta:
        model = EvaluationSample
        fields = [
            "index",
            "prompt",
            "item",
            "model_output",
            "model_score",
            "model_grader_error",
            "baseline_output",
            "baseline_score",
            "baseline_grader_error",
        ]


class EvaluationSamplePage(serializers.Serializer):
    data = EvaluationSampleOut(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class EvaluationDetailOut(EvaluationOut):
    """The schema of one evaluation: itself and a page of its samples."""

    samples = EvaluationSamplePage()

    class Meta(EvaluationOut.Meta):
        fields = [*EvaluationOut.Meta.fields, "samples"]


class EvaluationCreateIn(serializers.Serializer):
    model = serializers.CharField(max_length=MAX_NAME)
    baseline = serializers.CharField(max_length=MAX_NAME)
    file = serializers.CharField(max_length=100)
    grader = serializers.JSONField(required=False)
    reward_source = serializers.CharField(required=False, max_length=100_000, trim_whitespace=False)
    max_tokens = serializers.IntegerField(required=False, min_value=1, max_value=4096, default=256)
    temperature = serializers.FloatField(required=False, min_value=0, max_value=2, default=0.0)


class EvaluationsView(WorkspaceView):
    @list_schema(EvaluationOut, name="EvaluationPage", operation_id="evaluations_list")
    def get(self, request: Request) -> Response:
        return paginate(
            request, selectors.list_evaluations(workspace=self.workspace), EvaluationOut
        )

    @extend_schema(request=EvaluationCreateIn, responses={201: EvaluationOut})
    def post(self, request: Request) -> Response:
        data = self.validated(EvaluationCreateIn, request.data)
        created = services.create_evaluation(workspace=self.workspace, **data)
        evaluation = selectors.get_evaluation(
            workspace=self.workspace, evaluation_id=created.public_id
        )
        return Response(EvaluationOut(evaluation).data, status=201)


class EvaluationView(WorkspaceView):
    @extend_schema(responses=EvaluationDetailOut)
    def get(self, request: Request, evaluation_id: str) -> Response:
        """The evaluation and a page of its samples (`?limit=&cursor=`), in the file's order."""
        evaluation = selectors.get_evaluation(workspace=self.workspace, evaluation_id=evaluation_id)
        samples = selectors.list_evaluation_samples(evaluation=evaluation)
        page = paginate(request, samples, EvaluationSampleOut, order_by="index").data
        return Response({**EvaluationOut(evaluation).data, "samples": page})
