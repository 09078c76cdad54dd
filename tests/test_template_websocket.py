"""template.yaml's optional WebSocket API (EnableWebSocketApi): off by default, its routes, connect authorizer,
function, permissions and output. cfn-lint over the whole template runs in tests/test_template.py."""

from __future__ import annotations

import importlib
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parent.parent
WEBSOCKET_TYPES = (
    "AWS::ApiGatewayV2::", "AWS::Serverless::Function", "AWS::Logs::LogGroup", "AWS::Lambda::Permission",
    "AWS::CloudWatch::Alarm",
)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return cfn_yaml.load(str(ROOT / "template.yaml"))


@pytest.fixture(scope="module")
def resources(template: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in template["Resources"].items() if name.startswith("WebSocket")}


def test_the_websocket_api_is_off_unless_enabled(template, resources):
    parameter = template["Parameters"]["EnableWebSocketApi"]
    assert parameter["Default"] == "false" and parameter["AllowedValues"] == ["true", "false"]
    assert template["Conditions"]["HasWebSocketApi"] == {"Fn::Equals": [{"Ref": "EnableWebSocketApi"}, "true"]}
    assert {"WebSocketApi", "WebSocketFunction", "WebSocketStage", "WebSocketInvokePermission"} <= set(resources)
    for name, resource in resources.items():
        assert resource["Type"].startswith(WEBSOCKET_TYPES), name
        assert resource["Condition"] in ("HasWebSocketApi", "HasWebSocketAuthorizer", "HasWebSocketAccessLogs"), name
    assert template["Outputs"]["WebSocketUrl"]["Condition"] == "HasWebSocketApi"
    assert template["Outputs"]["WebSocketUrl"]["Value"]["Fn::Sub"].startswith("wss://${WebSocketApi}.")


def test_every_route_reaches_the_function_and_only_connect_is_authorized(resources):
    api = resources["WebSocketApi"]["Properties"]
    assert api["ProtocolType"] == "WEBSOCKET"
    routes = {r["Properties"]["RouteKey"]: r["Properties"] for r in resources.values()
              if r["Type"] == "AWS::ApiGatewayV2::Route"}
    assert set(routes) == {"$connect", "$disconnect", "$default"}
    for route in routes.values():
        assert route["Target"] == {"Fn::Sub": "integrations/${WebSocketIntegration}"}
    assert routes["$connect"]["AuthorizationType"] == {"Fn::If": ["HasWebSocketAuthorizer", "CUSTOM", "NONE"]}
    assert "AuthorizationType" not in routes["$default"]
    integration = resources["WebSocketIntegration"]["Properties"]
    assert integration["IntegrationType"] == "AWS_PROXY"
    assert "${WebSocketFunction.Arn}" in integration["IntegrationUri"]["Fn::Sub"]


def test_the_connect_authorizer_uses_the_http_apis_jwt_settings(template, resources):
    assert template["Conditions"]["HasWebSocketAuthorizer"] == {
        "Fn::And": [{"Condition": "HasWebSocketApi"}, {"Condition": "HasJwtAuthorizer"}]
    }
    authorizer = resources["WebSocketAuthorizer"]
    assert authorizer["Condition"] == "HasWebSocketAuthorizer"
    props = authorizer["Properties"]
    assert props["AuthorizerType"] == "REQUEST"
    # The token is a subprotocol a browser offers, never a query parameter (which access logs record).
    assert props["IdentitySource"] == ["route.request.header.Sec-WebSocket-Protocol"]
    assert "${WebSocketAuthorizerFunction.Arn}" in props["AuthorizerUri"]["Fn::Sub"]
    function = resources["WebSocketAuthorizerFunction"]
    assert function["Condition"] == "HasWebSocketAuthorizer"
    env = function["Properties"]["Environment"]["Variables"]
    assert env["JWT_ISSUER"] == {"Ref": "JwtIssuer"} and env["JWT_AUDIENCE"] == {"Ref": "JwtAudience"}
    module, _, attribute = function["Properties"]["Handler"].rpartition(".")
    assert callable(getattr(importlib.import_module(module), attribute))
    permission = resources["WebSocketAuthorizerInvokePermission"]["Properties"]
    assert permission["FunctionName"] == {"Ref": "WebSocketAuthorizerFunction"}
    assert permission["SourceArn"]["Fn::Sub"].endswith("${WebSocketApi}/authorizers/${WebSocketAuthorizer}")


def test_the_authorizer_reaches_no_data_and_the_turns_no_token_settings(template, resources):
    # Split roles: the authorizer's has no policy beyond its logs; the turns' function keeps no JWT settings.
    authorizer = resources["WebSocketAuthorizerFunction"]["Properties"]
    assert "Policies" not in authorizer
    for policy in ("BedrockInvokePolicy", "HotelMcpTokenPolicy", "KeyDecryptPolicy"):
        assert {"Ref": "WebSocketAuthorizerFunctionRole"} not in template["Resources"][policy]["Properties"]["Roles"]
    turns = resources["WebSocketFunction"]["Properties"]["Environment"]["Variables"]
    assert "JWT_ISSUER" not in turns and "JWT_AUDIENCE" not in turns


def test_no_anonymous_websocket_api_unless_a_parameter_says_so(template):
    parameter = template["Parameters"]["AllowAnonymousWebSocket"]
    assert parameter["Default"] == "false"
    rule = template["Rules"]["WebSocketApiIsAuthorizedOrSaysSo"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "EnableWebSocketApi"}, "true"]}
    (assertion,) = rule["Assertions"]
    assert assertion["Assert"] == {"Fn::Or": [
        {"Fn::Not": [{"Fn::Equals": [{"Ref": "JwtIssuer"}, ""]}]},
        {"Fn::Equals": [{"Ref": "AllowAnonymousWebSocket"}, "true"]},
    ]}


def test_the_stage_writes_an_access_log_without_bodies_or_tokens(template, resources):
    settings = resources["WebSocketStage"]["Properties"]["AccessLogSettings"]["Fn::If"]
    assert settings[0] == "HasWebSocketAccessLogs"
    assert settings[1]["DestinationArn"] == {"Fn::GetAtt": ["WebSocketAccessLogs", "Arn"]}
    fields = set(re.findall(r"\$context\.([A-Za-z.]+)", settings[1]["Format"]))
    assert {"requestId", "routeKey", "eventType", "status", "connectionId"} <= fields
    assert not {"requestBody", "body"} & fields and not any("querystring" in f.lower() for f in fields)
    assert resources["WebSocketAccessLogs"]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_the_websocket_function_is_primed_like_the_http_one():
    source = (ROOT / "handlers" / "websocket.py").read_text(encoding="utf-8")
    assert "priming.install()" in source


def test_the_function_runs_the_websocket_handler_on_the_same_sessions(template, resources):
    function = resources["WebSocketFunction"]
    props = function["Properties"]
    module, _, attribute = props["Handler"].rpartition(".")
    assert callable(getattr(importlib.import_module(module), attribute))
    assert props["Timeout"] == {"Ref": "WebSocketTimeout"}
    assert template["Parameters"]["WebSocketTimeout"]["MaxValue"] < 29
    assert props["MemorySize"] == {"Ref": "WebSocketMemorySize"}
    assert props["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasWebSocketReservedConcurrency", {"Ref": "WebSocketReservedConcurrency"}, {"Ref": "AWS::NoValue"}]
    }
    api_env = template["Resources"]["ApiFunction"]["Properties"]["Environment"]["Variables"]
    env = props["Environment"]["Variables"]
    for name in ("SESSION_STORE", "SESSION_TABLE", "SESSION_TTL_SECONDS", "PICOFLOW_FLOWS", "FILES_BUCKET",
                 "OPENAI_API_KEY_PARAMETER"):
        assert env[name] == api_env[name], name
    assert function["Metadata"]["BuildMethod"] == "makefile"
    assert re.search(r"^build-WebSocketFunction:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)


def test_the_function_may_post_to_its_own_apis_connections_only(resources):
    (statements,) = [policy["Statement"] for policy in resources["WebSocketFunction"]["Properties"]["Policies"]]
    (post,) = [s for s in statements if s["Action"] == "execute-api:ManageConnections"]
    assert post["Resource"]["Fn::Sub"].endswith(":${WebSocketApi}/live/POST/@connections/*")
    assert resources["WebSocketStage"]["Properties"]["StageName"] == "live"
    permission = resources["WebSocketInvokePermission"]["Properties"]
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["SourceArn"]["Fn::Sub"].endswith(":${WebSocketApi}/*")


def test_the_http_function_may_follow_a_decision_up_on_the_websocket_apis_connections_only(template):
    (statements,) = [policy["Statement"]
                     for policy in template["Resources"]["ApiFunction"]["Properties"]["Policies"]]
    [condition, push, absent] = next(s["Fn::If"] for s in statements if "Fn::If" in s)
    # Only with the WebSocket API, and only its stage's connections: the check that one is open, and the post.
    assert condition == "HasWebSocketApi" and absent == {"Ref": "AWS::NoValue"}
    assert push["Action"] == "execute-api:ManageConnections"
    assert [resource["Fn::Sub"].rsplit(":", 1)[-1] for resource in push["Resource"]] == [
        "${WebSocketApi}/live/POST/@connections/*", "${WebSocketApi}/live/GET/@connections/*"]


def test_a_disabled_websocket_api_builds_placeholders_and_an_enabled_one_this_checkout(
    template: dict[str, Any], resources: dict[str, Any], tmp_path: Path
) -> None:
    # sam build builds (and sam package uploads) every function whatever its Condition: while the API is off, its
    # functions' code comes from a folder whose Makefile writes a few bytes instead of building the function.
    mapping = template["Mappings"]["WebSocketCode"]
    assert mapping == {"true": {"CodeUri": "."}, "false": {"CodeUri": "deploy/placeholder"}}
    functions = {name: r for name, r in resources.items() if r["Type"] == "AWS::Serverless::Function"}
    assert set(functions) == {"WebSocketFunction", "WebSocketAuthorizerFunction"}
    sizes: dict[str, int] = {}
    for name, function in functions.items():
        assert function["Metadata"] == {"BuildMethod": "makefile"}
        assert function["Properties"]["CodeUri"] == {
            "Fn::FindInMap": ["WebSocketCode", {"Ref": "EnableWebSocketApi"}, "CodeUri"]}
        # Each folder's Makefile has the target sam runs for the function (build-<logical id>).
        enabled = (ROOT / mapping["true"]["CodeUri"] / "Makefile").read_text(encoding="utf-8")
        assert re.search(rf"^build-{name}:", enabled, re.MULTILINE), name
        out = tmp_path / name
        out.mkdir()
        subprocess.run(["make", "--no-print-directory", f"build-{name}", f"ARTIFACTS_DIR={out}"],
                       cwd=ROOT / mapping["false"]["CodeUri"], check=True, capture_output=True, timeout=60)
        built = [path for path in out.rglob("*") if path.is_file()]
        assert len(built) == 1 and built[0].stat().st_size < 200, built
        sizes[name] = built[0].stat().st_size
    # The placeholder folder holds its Makefile only: nothing else is packaged for a disabled function.
    assert [path.name for path in (ROOT / mapping["false"]["CodeUri"]).iterdir()] == ["Makefile"]
    # The production page's measured sam build states these sizes, and the function's as the deploy page does.
    production = (ROOT / "docs" / "operating" / "production.md").read_text(encoding="utf-8")
    deploy = (ROOT / "docs" / "get-started" / "deploy.md").read_text(encoding="utf-8")
    measured = re.search(r"measured ([\d.]+) MB unzipped", deploy)
    assert measured is not None
    stated = f"| {measured[1]} MB, {sizes['WebSocketFunction']} B and {sizes['WebSocketAuthorizerFunction']} B |"
    assert stated in production


def test_sam_builds_in_this_folder_without_copying_or_checksumming_it() -> None:
    build = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))["default"]["build"]["parameters"]
    assert build["build_in_source"] is True
    assert build["cached"] is False
