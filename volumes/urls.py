from django.urls import path

from volumes import api
from volumes.stores.local_view import LocalStoreView

urlpatterns = [
    path("volumes", api.VolumesView.as_view()),
    path("volumes/<str:volume_id>", api.VolumeView.as_view()),
    path("volumes/<str:volume_id>/files", api.VolumeFilesView.as_view()),
    path("volumes/<str:volume_id>/usage", api.VolumeUsageView.as_view()),
    path("volumes/<str:volume_id>/uploads:batch", api.UploadsBatchView.as_view()),
    path("volumes/<str:volume_id>/uploads:complete", api.UploadsCompleteBatchView.as_view()),
    path("volumes/<str:volume_id>/uploads/<str:upload_id>", api.UploadView.as_view()),
    path(
        "volumes/<str:volume_id>/uploads/<str:upload_id>/complete", api.UploadCompleteView.as_view()
    ),
    path("store/<str:token>", LocalStoreView.as_view(), name="local-store"),
]
