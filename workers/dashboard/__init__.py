"""The web dashboard the gateway serves at ``/`` (see ``docs/dashboard.md``)."""

from .routes import add_dashboard_routes

__all__ = ["add_dashboard_routes"]
