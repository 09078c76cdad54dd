import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template.yaml"
CFN_LINT = Path(sys.executable).with_name("cfn-lint")


@pytest.fixture(scope="module")
def template() -> dict:
    return cfn_yaml.load(str(TEMPLATE))


@pytest.fixture(scope="module")
def function(template) -> dict:
    (props,) = [
        r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"
    ]
    return props


@pytest.fixture(scope="module")
def table_name(function) -> str:
    return function["Environment"]["Variables"]["SESSION_TABLE"]["Ref"]


@pytest.fixture(scope="module")
def http_api(template) -> dict:
    (props,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::HttpApi"]
    return props


def test_cfn_lint_passes():
    result = subprocess.run(
        [str(CFN_LINT), str(TEMPLATE)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sam_transform_and_http_api(template):
    # LanguageExtensions must run before SAM so that the conditional Auth is resolved when SAM reads it.
    assert template["Transform"] == ["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]
    types = [r["Type"] for r in template["Resources"].values()]
    assert types.count("AWS::Serverless::HttpApi") == 1


def test_function_runtime_shape(function):
    assert function["Handler"] == "handlers.api.lambda_handler"
    assert function["CodeUri"] == "."
    major, minor = function["Runtime"].removeprefix("python").split(".")
    assert (int(major), int(minor)) >= (3, 12)
    assert function["Architectures"] == ["arm64"]
    assert 512 <= function["MemorySize"] <= 2048
    assert function["Timeout"] < 29


def test_routes(function):
    routes = {(e["Properties"]["Method"], e["Properties"]["Path"]) for e in function["Events"].values()}
    assert routes == {("POST", "/ai/run"), ("POST", "/ai/end"), ("GET", "/ai/flows"), ("GET", "/health")}
    assert all(e["Type"] == "HttpApi" for e in function["Events"].values())


def test_environment(function, table_name):
    env = function["Environment"]["Variables"]
    assert env["SESSION_STORE"] == "DYNAMODB"
    assert env["SESSION_TABLE"] == {"Ref": table_name}
    assert env["PICOFLOW_FLOWS"] == {"Ref": "FlowsModule"}
    assert env["SESSION_TTL_SECONDS"] == {"Ref": "SessionRetentionSeconds"}
    assert env["POWERTOOLS_LOG_LEVEL"] == {"Ref": "LogLevel"}
    assert env["POWERTOOLS_SERVICE_NAME"]
    assert env["POWERTOOLS_METRICS_NAMESPACE"]
    assert env["OPENAI_API_KEY_PARAMETER"] == {"Ref": "OpenAIKeyParameterName"}
    # Idempotency-Key receipts travel in the session item itself: no second table to keep in step.
    assert "IDEMPOTENCY_TABLE" not in env
    assert "OPENAI_API_KEY" not in env


def test_openai_key_is_only_a_parameter_name(template):
    params = template["Parameters"]
    assert params["OpenAIKeyParameterName"]["Type"] == "String"
    assert params["OpenAIKeyParameterName"]["Default"].startswith("/")
    assert [name for name in params if "key" in name.lower()] == ["OpenAIKeyParameterName"]


def test_sessions_table(template, table_name):
    table = template["Resources"][table_name]["Properties"]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == [{"AttributeName": "id", "AttributeType": "S"}]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expiresAt", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["SSESpecification"]["SSEEnabled"] is True


def _statements(function) -> list[dict]:
    statements = []
    for policy in function["Policies"]:
        assert isinstance(policy, dict) and "Statement" in policy, "only inline statements, no managed policies"
        statements.extend(policy["Statement"])
    return statements


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_dynamodb_access_is_item_level_and_on_the_sessions_table_only(template, function, table_name):
    dynamo = [s for s in _statements(function) if any(a.startswith("dynamodb:") for a in _as_list(s["Action"]))]
    actions: dict[str, set[str]] = {}
    for statement in dynamo:
        assert statement["Effect"] == "Allow"
        (resource,) = _as_list(statement["Resource"])
        table = resource["Fn::GetAtt"][0]
        assert resource == {"Fn::GetAtt": [table, "Arn"]}
        actions.setdefault(table, set()).update(_as_list(statement["Action"]))
    assert actions == {
        table_name: {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"},
    }
    tables = [name for name, r in template["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table"]
    assert tables == [table_name]


def test_jwt_authorizer_is_optional(template, http_api):
    params = template["Parameters"]
    assert params["JwtIssuer"]["Default"] == "" and params["JwtAudience"]["Default"] == ""
    assert template["Conditions"]["HasJwtAuthorizer"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "JwtIssuer"}, ""]}]}
    condition, enabled, disabled = http_api["Auth"]["Fn::If"]
    assert condition == "HasJwtAuthorizer"
    assert disabled == {"Ref": "AWS::NoValue"}
    name = enabled["DefaultAuthorizer"]
    authorizer = enabled["Authorizers"][name]
    assert authorizer["IdentitySource"] == "$request.header.Authorization"
    assert authorizer["JwtConfiguration"] == {
        "issuer": {"Ref": "JwtIssuer"},
        "audience": {"Fn::Split": [",", {"Ref": "JwtAudience"}]},
    }


def test_jwt_settings_must_come_together(template):
    (rule,) = template["Rules"].values()
    (assertion,) = rule["Assertions"]
    both_empty, both_set = assertion["Assert"]["Fn::Or"]
    assert both_empty == {
        "Fn::And": [{"Fn::Equals": [{"Ref": "JwtIssuer"}, ""]}, {"Fn::Equals": [{"Ref": "JwtAudience"}, ""]}]
    }
    assert both_set == {"Fn::And": [{"Fn::Not": [c]} for c in both_empty["Fn::And"]]}


def test_only_health_is_open_when_the_authorizer_is_on(function):
    opened = {
        e["Properties"]["Path"]: e["Properties"]["Auth"]["Fn::If"]
        for e in function["Events"].values()
        if "Auth" in e["Properties"]
    }
    assert opened == {"/health": ["HasJwtAuthorizer", {"Authorizer": "NONE"}, {"Ref": "AWS::NoValue"}]}


def test_no_wildcards_in_inline_policies(function):
    for statement in _statements(function):
        assert all("*" not in a for a in _as_list(statement["Action"]))
        assert all(r != "*" for r in _as_list(statement["Resource"]))


def test_ssm_read_is_scoped_to_the_key_parameter(function):
    ssm = [s for s in _statements(function) if any(a.startswith("ssm:") for a in _as_list(s["Action"]))]
    assert [a for s in ssm for a in _as_list(s["Action"])] == ["ssm:GetParameter"]
    (resource,) = _as_list(ssm[0]["Resource"])
    assert "${OpenAIKeyParameterName}" in resource["Fn::Sub"]
    assert resource["Fn::Sub"].startswith("arn:${AWS::Partition}:ssm:")


def test_outputs(template, table_name):
    outputs = template["Outputs"]
    assert "execute-api" in outputs["ApiUrl"]["Value"]["Fn::Sub"]
    assert outputs["SessionsTableName"]["Value"] == {"Ref": table_name}
    assert "IdempotencyTableName" not in outputs
