"""The web dashboard the gateway serves at ``/`` (see ``docs/dashboard.md``): ``routes.add_dashboard_routes``
adds its pages to an aiohttp app; ``data`` holds the queries behind them."""
