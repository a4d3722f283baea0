"""dashboard/urls.py less its `ingest` route (tests/test_ingest_fastpath.py: a route removed there is gone from both paths)."""
from dashboard.urls import urlpatterns as every_route

urlpatterns = [route for route in every_route if getattr(route, "name", None) != "ingest"]
