"""The simulate addon: plays a provider's limits (trimflow_simulate, a profile of trimflow_profiles).

A request whose forwarded body breaks the profile gets that provider's error answer instead of going
upstream, and its record says so (simulated, status). It runs after the prune addon, on the body the
prune addon leaves to be forwarded: pruned in enforce, as sent in observe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from .._decode import DecodeError, decode_body
from .._limit_profiles import DEFAULT_PROFILES_PATH, OFF, Profile, Violation, check_request, load_profiles, select_profile
from .options import exits_at_startup
from .state import FlowState, SharedState, path_of, write

log = logging.getLogger("trimflow")


class Simulate:
    name = "trimflow_simulate"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.profile: Profile | None = None  # trimflow_simulate's profile; None when off

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_simulate",
            str,
            OFF,
            "Name of a limit profile (see trimflow_profiles) to play the provider: a request that would be forwarded "
            "breaking it gets that provider's error answer instead, and its record says simulated. off: forward all.",
        )
        loader.add_option(
            "trimflow_profiles",
            str,
            str(DEFAULT_PROFILES_PATH),
            "YAML file of limit profiles for trimflow_simulate; checked when given, used when trimflow_simulate is not off.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if "trimflow_simulate" in updated or "trimflow_profiles" in updated:
            try:
                self.profile = select_profile(ctx.options.trimflow_simulate, ctx.options.trimflow_profiles)
                if self.profile is None and ctx.options.trimflow_profiles != str(DEFAULT_PROFILES_PATH):
                    load_profiles(ctx.options.trimflow_profiles)  # a file given is checked even while simulation is off
            except ValueError as exc:  # ProfilesError (file:line: problem) or UnknownProfile (lists the names)
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
            if self.profile is not None:
                log.info("trimflow: simulating limit profile %s from %s", self.profile.name, ctx.options.trimflow_profiles)

    def request(self, flow: http.HTTPFlow) -> Coroutine[None, None, None] | None:
        # Not `async def`: with simulation off, the usual case, no coroutine is made per request.
        # mitmproxy awaits what a hook returns when it is awaitable.
        if self.profile is None or flow.response is not None:
            return None
        state = self.flows.get(flow)
        if state is None:
            return None
        return self._answer(flow, state, self.profile)

    async def _answer(self, flow: http.HTTPFlow, state: FlowState, profile: Profile) -> None:
        record = self.flows.settle(flow, state)
        if record is None:
            return
        try:
            violation = await asyncio.to_thread(self._check, flow, profile, record.format)
        except Exception as exc:  # noqa: BLE001 - fail open: the request goes upstream
            log.warning("trimflow: %s%s not simulated: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)
            return
        if violation is None:
            return
        flow.response = http.Response.make(violation.status, violation.body, {"content-type": violation.content_type})
        record.simulated, record.status = violation.profile, violation.status
        write(flow, state)

    def _check(self, flow: http.HTTPFlow, profile: Profile, wire_format: str) -> Violation | None:
        """In a worker thread: the body is decoded and parsed again."""
        request = flow.request
        try:
            body = decode_body(request.raw_content or b"", request.headers.get("content-encoding"), self.flows.max_decoded_bytes)
        except DecodeError:  # the prune addon has said why it forwarded the body untouched
            return None
        return check_request(profile, request.path, body, wire_format)
