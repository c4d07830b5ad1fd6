"""`/v1/regions` and `/v1/gpus`: the catalog, and which providers this deployment can use."""

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from providers import catalog
from providers.services import available_regions, default_provider, is_usable
from veri.api import WorkspaceView
from veri.errors import VeriError

RegionOut = inline_serializer(
    "Region",
    {
        "code": serializers.CharField(),
        "name": serializers.CharField(),
        "default": serializers.BooleanField(),
        "coming_soon": serializers.BooleanField(),
    },
    many=True,
)
GpuOut = inline_serializer(
    "Gpu",
    {
        "provider": serializers.CharField(),
        "usable": serializers.BooleanField(),
        "default_provider": serializers.BooleanField(),
        "gpu_type": serializers.CharField(),
        "memory_gb": serializers.IntegerField(),
        "max_count": serializers.IntegerField(),
        "price_per_gpu_hour_usd": serializers.CharField(),
        "regions": serializers.ListField(child=serializers.CharField()),
        "available_regions": serializers.ListField(
            child=serializers.CharField(),
            allow_null=True,
            required=False,
            help_text="with ?provider=: regions with capacity now (null: it does not say)",
        ),
    },
    many=True,
)


class RegionsView(WorkspaceView):
    @extend_schema(responses=inline_serializer("Regions", {"data": RegionOut}))
    def get(self, request: Request) -> Response:
        default = catalog.default_region()
        return Response(
            {
                "data": [
                    {
                        "code": r.code,
                        "name": r.name,
                        "default": r.code == default,
                        "coming_soon": r.coming_soon,
                    }
                    for r in catalog.REGIONS
                ]
            }
        )


class GpusView(WorkspaceView):
    @extend_schema(
        parameters=[OpenApiParameter("provider", str)],
        responses=inline_serializer("Gpus", {"data": GpuOut}),
    )
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("provider")
        specs = catalog.providers()
        if wanted:
            specs = [s for s in specs if s.name == wanted]
            if not specs:
                raise VeriError(
                    f"Unknown provider {wanted!r}.", field="provider", code="invalid_provider"
                )
        default = default_provider()
        rows = []
        for spec in specs:
            usable = wanted and is_usable(spec.name)
            for gpu in spec.gpus:
                row = {
                    "provider": spec.name,
                    "usable": is_usable(spec.name),
                    "default_provider": spec.name == default,
                    "gpu_type": gpu.name,
                    "memory_gb": gpu.memory_gb,
                    "max_count": gpu.max_count,
                    "price_per_gpu_hour_usd": gpu.price_per_gpu_hour,
                    "regions": sorted(spec.zones),
                }
                if wanted:  # asked about one provider: what it says is free right now
                    regions = available_regions(spec.name, gpu.name) if usable else []
                    row["available_regions"] = None if regions is None else sorted(regions)
                rows.append(row)
        return Response({"data": rows})
