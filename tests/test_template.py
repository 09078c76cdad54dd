import re
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template.yaml"
CFN_LINT = Path(sys.executable).with_name("cfn-lint")
# The roles SAM creates for the functions that call models: the HTTP API's, and the WebSocket API's when enabled.
FUNCTION_ROLES = [
    {"Ref": "ApiFunctionRole"},
    {"Fn::If": ["HasWebSocketApi", {"Ref": "WebSocketFunctionRole"}, {"Ref": "AWS::NoValue"}]},
]


@pytest.fixture(scope="module")
def template() -> dict:
    return cfn_yaml.load(str(TEMPLATE))


@pytest.fixture(scope="module")
def function(template) -> dict:
    """The HTTP API's function (the WebSocket API, when enabled, has one of its own)."""
    return template["Resources"]["ApiFunction"]["Properties"]


def stack_table(value: dict) -> dict:
    """The stack's own table in ``value``, which names RestoredTableName instead when that is set."""
    if "Fn::If" in value:
        condition, restored, own = value["Fn::If"]
        assert condition == "HasRestoredTable" and "RestoredTableName" in str(restored)
        return own
    return value


@pytest.fixture(scope="module")
def table_name(function) -> str:
    return stack_table(function["Environment"]["Variables"]["SESSION_TABLE"])["Ref"]


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


def test_memory_and_timeout_are_parameters(template, function):
    params = template["Parameters"]
    assert function["MemorySize"] == {"Ref": "MemorySize"} and function["Timeout"] == {"Ref": "Timeout"}
    memory, timeout = params["MemorySize"], params["Timeout"]
    assert memory["Type"] == timeout["Type"] == "Number"
    # 512 MB covers the primed init (docs/operating/production.md); below 256 MB init can pass Lambda's limit.
    assert memory["Default"] == 512 and memory["MinValue"] >= 256 and memory["MaxValue"] == 10240
    # Below API Gateway's 29 s integration limit, so a slow turn ends in the function's own envelope.
    assert timeout["Default"] == 25 and timeout["MaxValue"] < 29


def test_routes(function):
    routes = {(e["Properties"]["Method"], e["Properties"]["Path"]) for e in function["Events"].values()}
    assert routes == {
        ("POST", "/ai/run"), ("POST", "/ai/files"), ("POST", "/ai/end"), ("GET", "/ai/flows"), ("GET", "/health"),
        ("DELETE", "/ai/me"),
        ("POST", "/ai/approvals"), ("GET", "/ai/approvals"),
        ("POST", "/ag-ui/{flowName}"), ("POST", "/mcp"), ("POST", "/a2a/{flowName}"),
        ("GET", "/a2a/{flowName}/.well-known/agent-card.json"),
    }
    assert all(e["Type"] == "HttpApi" for e in function["Events"].values())


def test_the_openapi_document_lists_every_route_the_template_deploys(function):
    from picoflow.aws.api import openapi_schema

    paths = openapi_schema()["paths"]
    for event in function["Events"].values():
        method, path = event["Properties"]["Method"].lower(), event["Properties"]["Path"]
        assert method in paths.get(path, {}), f"{method.upper()} {path} is not in the OpenAPI document"


def test_the_function_knows_whether_the_api_requires_a_jwt(function):
    # The A2A agent cards declare the bearer scheme exactly when the authorizer is on.
    assert function["Environment"]["Variables"]["JWT_ISSUER"] == {"Ref": "JwtIssuer"}


def test_environment(function, table_name):
    env = function["Environment"]["Variables"]
    assert env["SESSION_STORE"] == "DYNAMODB"
    assert stack_table(env["SESSION_TABLE"]) == {"Ref": table_name}
    assert env["PICOFLOW_FLOWS"] == {"Ref": "FlowsModule"}
    assert env["SESSION_TTL_SECONDS"] == {"Ref": "SessionRetentionSeconds"}
    assert env["POWERTOOLS_LOG_LEVEL"] == {"Ref": "LogLevel"}
    assert env["POWERTOOLS_SERVICE_NAME"]
    assert env["POWERTOOLS_METRICS_NAMESPACE"]
    assert env["OPENAI_API_KEY_PARAMETER"] == {"Ref": "OpenAIKeyParameterName"}
    assert env["FILES_BUCKET"] == {"Ref": "FilesBucket"}
    # Idempotency-Key receipts travel in the session item itself: no second table to keep in step.
    assert "IDEMPOTENCY_TABLE" not in env
    assert "OPENAI_API_KEY" not in env


def test_openai_key_is_only_a_parameter_name(template):
    params = template["Parameters"]
    assert params["OpenAIKeyParameterName"]["Type"] == "String"
    assert params["OpenAIKeyParameterName"]["Default"].startswith("/")
    # No parameter takes a secret: the key's parameter name, and the ARN of the KMS key that encrypts it.
    assert [name for name in params if "key" in name.lower()] == ["OpenAIKeyParameterName", "KmsKeyArn"]


def test_key_parameters_are_kept_for_a_max_age(template, function):
    assert function["Environment"]["Variables"]["PICOFLOW_PARAMETER_MAX_AGE"] == {"Ref": "ParameterMaxAgeSeconds"}
    assert template["Parameters"]["ParameterMaxAgeSeconds"]["Default"] == 300


def test_a_customer_managed_key_is_decrypted_through_ssm_only(template):
    assert template["Parameters"]["KmsKeyArn"]["Default"] == ""
    policy = template["Resources"]["KeyDecryptPolicy"]
    assert policy["Condition"] == "HasKmsKey"
    assert policy["Properties"]["Roles"][0] == {"Ref": "ApiFunctionRole"}
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert (statement["Action"], statement["Resource"]) == ("kms:Decrypt", {"Ref": "KmsKeyArn"})
    assert statement["Condition"] == {
        "StringEquals": {"kms:ViaService": {"Fn::Sub": "ssm.${AWS::Region}.amazonaws.com"}}
    }


def test_sessions_table(template, table_name):
    table = template["Resources"][table_name]["Properties"]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == [
        {"AttributeName": "id", "AttributeType": "S"}, {"AttributeName": "owner", "AttributeType": "S"},
        {"AttributeName": "reviewQueue", "AttributeType": "S"},
    ]
    # Erasure reads the owner index, reviewers the sparse reviews index: the same names and shapes as the store's
    # own tables.
    from picoflow.session.dynamodb_table import GLOBAL_SECONDARY_INDEXES

    assert [index["IndexName"] for index in GLOBAL_SECONDARY_INDEXES] == ["owner-index", "reviews"]
    assert table["GlobalSecondaryIndexes"] == list(GLOBAL_SECONDARY_INDEXES)
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expiresAt", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["SSESpecification"]["SSEEnabled"] is True


def _statements(function) -> list[dict]:
    statements = []
    for policy in function["Policies"]:
        assert isinstance(policy, dict) and "Statement" in policy, "only inline statements, no managed policies"
        # A statement under a condition (Fn::If) is checked as it reads when the condition holds.
        statements.extend(s["Fn::If"][1] if "Fn::If" in s else s for s in policy["Statement"])
    return statements


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_dynamodb_access_is_item_level_and_on_the_sessions_table_only(template, function, table_name):
    dynamo = [s for s in _statements(function) if any(a.startswith("dynamodb:") for a in _as_list(s["Action"]))]
    actions: dict[str, set[str]] = {}
    for statement in dynamo:
        assert statement["Effect"] == "Allow"
        (resource,) = _as_list(statement["Resource"])
        resource = stack_table(resource)
        if "Fn::Sub" in resource:
            # The function's queries: erasure on the owner index, reviewers' list on the reviews index (never the
            # table: no scan).
            index = resource["Fn::Sub"].removeprefix("${SessionsTable.Arn}/index/")
            assert index in ("owner-index", "reviews"), resource
            actions.setdefault(index, set()).update(_as_list(statement["Action"]))
            continue
        table = resource["Fn::GetAtt"][0]
        assert resource == {"Fn::GetAtt": [table, "Arn"]}
        actions.setdefault(table, set()).update(_as_list(statement["Action"]))
    assert actions == {
        table_name: {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"},
        "owner-index": {"dynamodb:Query"},
        "reviews": {"dynamodb:Query"},
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
    rule = template["Rules"]["JwtSettingsComeTogether"]
    (assertion,) = rule["Assertions"]
    both_empty, both_set = assertion["Assert"]["Fn::Or"]
    assert both_empty == {
        "Fn::And": [{"Fn::Equals": [{"Ref": "JwtIssuer"}, ""]}, {"Fn::Equals": [{"Ref": "JwtAudience"}, ""]}]
    }
    assert both_set == {"Fn::And": [{"Fn::Not": [c]} for c in both_empty["Fn::And"]]}


def test_only_health_and_the_agent_cards_are_open_when_the_authorizer_is_on(function):
    opened = {
        e["Properties"]["Path"]: e["Properties"]["Auth"]["Fn::If"]
        for e in function["Events"].values()
        if "Auth" in e["Properties"]
    }
    none = ["HasJwtAuthorizer", {"Authorizer": "NONE"}, {"Ref": "AWS::NoValue"}]
    # Agent cards are read before a client holds a token; each card declares the bearer scheme instead.
    assert opened == {"/health": none, "/a2a/{flowName}/.well-known/agent-card.json": none}


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
    assert stack_table(outputs["SessionsTableName"]["Value"]) == {"Ref": table_name}
    assert "IdempotencyTableName" not in outputs


def _evaluate(condition, values: dict[str, str]) -> bool:
    """Evaluate a condition the way CloudFormation does: parameter values are strings."""
    ((function, args),) = condition.items()
    if function == "Fn::Not":
        return not _evaluate(args[0], values)
    if function == "Fn::Equals":
        left, right = (values[a["Ref"]] if isinstance(a, dict) else str(a) for a in args)
        return left == right
    raise AssertionError(f"unexpected condition function {function}")


def _defaults(template) -> dict[str, str]:
    return {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}


def test_parameter_defaults_meet_their_own_constraints(template):
    for name, param in template["Parameters"].items():
        default = param["Default"]
        if param["Type"] == "Number":
            assert param.get("MinValue", default) <= default <= param.get("MaxValue", default), name
        if "AllowedPattern" in param:
            assert re.fullmatch(param["AllowedPattern"], str(default)), name
        if "AllowedValues" in param:
            assert default in param["AllowedValues"], name


# Value of CorsAllowOrigins -> whether the parameter accepts it.
CORS_ORIGINS = {
    "": True,  # CORS off
    "*": True,
    "https://app.example.com": True,
    "https://app.example.com,http://localhost:3000": True,
    "https://app.example.com/": False,  # browsers send origins without a trailing slash
    "https://app.example.com, http://localhost:3000": False,  # a space would become part of the origin
    "app.example.com": False,
    "*,https://app.example.com": False,
}


def test_cors_parameters(template):
    params = template["Parameters"]
    origins = params["CorsAllowOrigins"]
    assert origins["Type"] == "String" and origins["Default"] == ""
    accepted = {value for value in CORS_ORIGINS if re.fullmatch(origins["AllowedPattern"], value)}
    assert accepted == {value for value, ok in CORS_ORIGINS.items() if ok}
    max_age = params["CorsMaxAgeSeconds"]
    assert max_age["Type"] == "Number" and max_age["Default"] == 600
    assert max_age["MinValue"] == 0 and max_age["MaxValue"] == 86400


def test_cors_is_off_unless_origins_are_given(template):
    condition = template["Conditions"]["HasCors"]
    assert condition == {"Fn::Not": [{"Fn::Equals": [{"Ref": "CorsAllowOrigins"}, ""]}]}
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"CorsAllowOrigins": "https://app.example.com"}) is True


def test_cors_configuration(http_api):
    condition, enabled, disabled = http_api["CorsConfiguration"]["Fn::If"]
    assert condition == "HasCors"
    assert disabled == {"Ref": "AWS::NoValue"}
    assert enabled == {
        "AllowOrigins": {"Fn::Split": [",", {"Ref": "CorsAllowOrigins"}]},
        "AllowMethods": ["GET", "POST", "DELETE", "OPTIONS"],
        "AllowHeaders": ["content-type", "authorization", "chat_session_id", "idempotency-key"],
        "ExposeHeaders": ["chat_session_id", "idempotent-replayed", "retry-after"],
        "AllowCredentials": False,
        "MaxAge": {"Ref": "CorsMaxAgeSeconds"},
    }


def test_preflights_are_answered_by_the_gateway_without_a_token(function, http_api):
    # API Gateway answers an OPTIONS preflight itself only when no route matches it; a catch-all
    # route would send it to the integration through the JWT authorizer, which has no token to check.
    assert "DefinitionBody" not in http_api and "DefinitionUri" not in http_api
    allowed = set(http_api["CorsConfiguration"]["Fn::If"][1]["AllowMethods"])
    for event in function["Events"].values():
        method, path = event["Properties"]["Method"], event["Properties"]["Path"]
        assert method.upper() in allowed - {"OPTIONS"}, method
        assert path != "$default" and "+}" not in path, path


def test_cors_settings_reach_the_function(function):
    env = function["Environment"]["Variables"]
    assert env["CORS_ALLOW_ORIGIN"] == {"Ref": "CorsAllowOrigins"}
    assert env["CORS_MAX_AGE_SECONDS"] == {"Ref": "CorsMaxAgeSeconds"}


def test_handler_cors_matches_the_gateway(template, http_api):
    # The handler serves the same CORS rules when it runs without API Gateway in front.
    from picoflow.aws.cors import CORS_DEFAULT_MAX_AGE_SECONDS, CORS_EXPOSED_HEADERS, CORS_REQUEST_HEADERS

    gateway = http_api["CorsConfiguration"]["Fn::If"][1]
    assert list(CORS_REQUEST_HEADERS) == gateway["AllowHeaders"]
    assert list(CORS_EXPOSED_HEADERS) == gateway["ExposeHeaders"]
    assert template["Parameters"]["CorsMaxAgeSeconds"]["Default"] == CORS_DEFAULT_MAX_AGE_SECONDS


def test_default_route_throttling(template, http_api):
    assert http_api["DefaultRouteSettings"] == {
        "ThrottlingBurstLimit": {"Ref": "ThrottleBurstLimit"},
        "ThrottlingRateLimit": {"Ref": "ThrottleRateLimit"},
    }
    params = template["Parameters"]
    burst, rate = params["ThrottleBurstLimit"], params["ThrottleRateLimit"]
    assert burst["Type"] == rate["Type"] == "Number"
    assert (burst["Default"], rate["Default"]) == (50, 20)
    # Zero would turn every request away with 429.
    assert burst["MinValue"] >= 1 and rate["MinValue"] >= 1
    assert burst["Default"] >= rate["Default"]


def test_reserved_concurrency(template, function):
    param = template["Parameters"]["ReservedConcurrency"]
    # Off by default: a reservation fails to deploy on an account whose concurrency quota is small.
    assert param["Type"] == "Number" and param["Default"] == 0 and param["MinValue"] == 0
    assert "model provider" in param["Description"] and "other functions" in param["Description"]
    assert "quota" in param["Description"]
    condition = template["Conditions"]["HasReservedConcurrency"]
    # 0 means no reservation at all, not a reservation of zero (which would throttle every request).
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"ReservedConcurrency": "10"}) is True
    assert function["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasReservedConcurrency", {"Ref": "ReservedConcurrency"}, {"Ref": "AWS::NoValue"}]
    }


# Value of BedrockModelId -> whether the parameter accepts it.
BEDROCK_MODEL_IDS = {
    "": True,  # no Bedrock access
    "amazon.nova-lite-v1:0": True,
    "anthropic.claude-3-5-haiku-20241022-v1:0": True,
    "meta.llama3-1-70b-instruct-v1:0": True,
    "*": False,
    "anthropic.*": False,
    "us.anthropic.claude-sonnet-4-5-20250929-v1:0": False,  # an inference profile, not a foundation model
    "global.anthropic.claude-sonnet-4-5-20250929-v1:0": False,
    "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-lite-v1:0": False,
    "amazon.nova lite": False,
}


def _conditional_policy(template, condition: str) -> tuple[str, dict]:
    (found,) = [
        (name, r) for name, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Policy" and r.get("Condition") == condition
    ]
    return found


def _bedrock_policy(template) -> tuple[str, dict]:
    return _conditional_policy(template, "HasBedrockModel")


def test_bedrock_model_parameter(template):
    param = template["Parameters"]["BedrockModelId"]
    assert param["Type"] == "String" and param["Default"] == ""
    accepted = {value for value in BEDROCK_MODEL_IDS if re.fullmatch(param["AllowedPattern"], value)}
    assert accepted == {value for value, ok in BEDROCK_MODEL_IDS.items() if ok}
    assert "inference profile" in param["Description"]


def test_bedrock_access_is_off_unless_a_model_is_given(template):
    condition = template["Conditions"]["HasBedrockModel"]
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"BedrockModelId": "amazon.nova-lite-v1:0"}) is True
    _, policy = _bedrock_policy(template)
    assert policy["Condition"] == "HasBedrockModel"


def test_the_function_itself_grants_no_bedrock_access(function):
    actions = [a for s in _statements(function) for a in _as_list(s["Action"])]
    assert not [a for a in actions if a.startswith("bedrock:")]


def test_bedrock_policy_allows_invoking_the_chosen_model_only(template):
    _, policy = _bedrock_policy(template)
    props = policy["Properties"]
    # SAM names the role it creates for a function <FunctionLogicalId>Role.
    assert props["Roles"] == FUNCTION_ROLES
    (statement,) = props["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert sorted(statement["Action"]) == ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
    assert statement["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:bedrock:${AWS::Region}::foundation-model/${BedrockModelId}"
    }
    assert "*" not in statement["Resource"]["Fn::Sub"]


def test_the_hotel_mcp_token_is_read_from_ssm_only_when_named(template, function):
    param = template["Parameters"]["HotelMcpAuthorizationParameterName"]
    assert param["Default"] == "" and re.fullmatch(param["AllowedPattern"], "/picoflow/hotel-mcp-token")
    assert not re.fullmatch(param["AllowedPattern"], "Bearer abc")
    env = function["Environment"]["Variables"]
    assert env["HOTEL_MCP_AUTHORIZATION_PARAMETER"] == {"Ref": "HotelMcpAuthorizationParameterName"}
    condition = template["Conditions"]["HasHotelMcpAuthorization"]
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"HotelMcpAuthorizationParameterName": "/a/b"}) is True
    _, policy = _conditional_policy(template, "HasHotelMcpAuthorization")
    assert policy["Properties"]["Roles"] == FUNCTION_ROLES
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert (statement["Effect"], statement["Action"]) == ("Allow", "ssm:GetParameter")
    assert statement["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter"
                   "${HotelMcpAuthorizationParameterName}"
    }


def test_files_bucket_is_private_encrypted_tls_only_and_expires_uploads(template):
    bucket = template["Resources"]["FilesBucket"]["Properties"]
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    assert len(bucket["PublicAccessBlockConfiguration"]) == 4
    (encryption,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert encryption["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    (rule,) = bucket["LifecycleConfiguration"]["Rules"]
    assert (rule["Status"], rule["Prefix"], rule["ExpirationInDays"]) == (
        "Enabled", "uploads/", {"Ref": "FileRetentionDays"}
    )
    (statement,) = template["Resources"]["FilesBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_files_bucket_cors_mirrors_the_apis_origins(template, http_api):
    cors = template["Resources"]["FilesBucket"]["Properties"]["CorsConfiguration"]["Fn::If"]
    assert cors[0] == "HasCors" and cors[2] == {"Ref": "AWS::NoValue"}
    (rule,) = cors[1]["CorsRules"]
    assert rule["AllowedOrigins"] == http_api["CorsConfiguration"]["Fn::If"][1]["AllowOrigins"]
    assert rule["AllowedMethods"] == ["PUT"]


def test_file_access_is_object_level_under_the_upload_prefix(function):
    s3 = [s for s in _statements(function) if any(a.startswith("s3:") for a in _as_list(s["Action"]))]
    objects, listing = s3
    assert sorted(_as_list(objects["Action"])) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
    (resource,) = _as_list(objects["Resource"])
    assert resource == {"Fn::Sub": "${FilesBucket.Arn}/uploads/*"}
    # Erasure lists the uploads, and nothing else of the bucket.
    assert listing["Action"] == "s3:ListBucket"
    assert listing["Resource"] == {"Fn::GetAtt": ["FilesBucket", "Arn"]}
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "uploads/*"}}


def test_snapstart_is_off_unless_enabled(template, function):
    param = template["Parameters"]["EnableSnapStart"]
    assert param["Type"] == "String" and param["Default"] == "false"
    assert sorted(param["AllowedValues"]) == ["false", "true"]
    condition = template["Conditions"]["HasSnapStart"]
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"EnableSnapStart": "true"}) is True
    # SnapStart snapshots published versions only, so enabling it also publishes one behind an alias.
    assert function["SnapStart"] == {
        "Fn::If": ["HasSnapStart", {"ApplyOn": "PublishedVersions"}, {"Ref": "AWS::NoValue"}]
    }
    assert function["AutoPublishAlias"] == {"Fn::If": ["HasSnapStart", "live", {"Ref": "AWS::NoValue"}]}



def test_samconfig_reserves_no_concurrency():
    import tomllib

    config = tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]["deploy"]["parameters"]
    assert "ReservedConcurrency" not in config.get("parameter_overrides", "")


def test_the_sessions_table_is_protected_from_deletion(template, table_name):
    table = template["Resources"][table_name]
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"


# -- alarms ---------------------------------------------------------------------------------------------------


def _alarms(template) -> dict[str, dict]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}


def _metrics(alarm: dict) -> list[tuple[str, str, dict, str]]:
    """(namespace, metric name, dimensions, statistic) of each metric the alarm reads."""
    props = alarm["Properties"]
    if "MetricName" in props:
        dimensions = {d["Name"]: d["Value"] for d in props.get("Dimensions", [])}
        return [(props["Namespace"], props["MetricName"], dimensions, props["Statistic"])]
    found = []
    for query in props["Metrics"]:
        if "MetricStat" in query:
            metric = query["MetricStat"]["Metric"]
            dimensions = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
            found.append((metric["Namespace"], metric["MetricName"], dimensions, query["MetricStat"]["Stat"]))
    return found


def _expression(alarm: dict) -> str:
    (expression,) = [q["Expression"] for q in alarm["Properties"]["Metrics"] if "Expression" in q]
    return expression if isinstance(expression, str) else expression["Fn::Sub"]


def _alarm_on(template, namespace: str, metric_name: str) -> dict:
    """The HTTP path's alarm on ``metric_name`` (the WebSocket path's twins carry the condition HasWebSocketApi)."""
    (alarm,) = [
        a for a in _alarms(template).values()
        if "Condition" not in a or a["Condition"] != "HasWebSocketApi"
        if any(m[:2] == (namespace, metric_name) for m in _metrics(a))
    ]
    return alarm


def test_alarm_topic_parameter(template):
    param = template["Parameters"]["AlarmTopicArn"]
    assert param["Type"] == "String" and param["Default"] == ""
    assert re.fullmatch(param["AllowedPattern"], "arn:aws:sns:eu-west-1:123456789012:picoflow-alarms")
    assert not re.fullmatch(param["AllowedPattern"], "picoflow-alarms")
    condition = template["Conditions"]["HasAlarmTopic"]
    assert _evaluate(condition, _defaults(template)) is False
    assert _evaluate(condition, _defaults(template) | {"AlarmTopicArn": "arn:aws:sns:eu-west-1:1:t"}) is True


def test_every_alarm_notifies_the_optional_topic(template):
    alarms = _alarms(template)
    assert len(alarms) == 15
    notify = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for name, alarm in alarms.items():
        props = alarm["Properties"]
        assert props["AlarmActions"] == props["OKActions"] == notify, name
        assert props["TreatMissingData"] == "notBreaching", name
        assert props["AlarmDescription"], name


def test_api_5xx_rate_alarm(template):
    alarm = _alarm_on(template, "AWS/ApiGateway", "5xx")
    metrics = _metrics(alarm)
    assert {(m[1], m[3]) for m in metrics} == {("5xx", "Sum"), ("Count", "Sum")}
    assert all(m[2] == {"ApiId": {"Ref": "HttpApi"}} for m in metrics)
    # Counted against at least 20 requests: at low traffic one 5xx is 5 % and fires it.
    assert _expression(alarm) == "100 * errors / IF(requests < 20, 20, requests)"
    assert alarm["Properties"]["Threshold"] == 5


@pytest.mark.parametrize("metric_name", ["Errors", "Throttles"])
def test_function_errors_and_throttles_alarms(template, metric_name):
    alarm = _alarm_on(template, "AWS/Lambda", metric_name)
    assert _metrics(alarm) == [("AWS/Lambda", metric_name, {"FunctionName": {"Ref": "ApiFunction"}}, "Sum")]
    props = alarm["Properties"]
    assert (props["ComparisonOperator"], props["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)


def test_p99_duration_alarm_is_relative_to_the_timeout(template):
    alarm = _alarm_on(template, "AWS/Lambda", "Duration")
    assert _metrics(alarm) == [("AWS/Lambda", "Duration", {"FunctionName": {"Ref": "ApiFunction"}}, "p99")]
    # Duration is in milliseconds, the Timeout parameter in seconds: the expression gives a share of it.
    assert _expression(alarm) == "100 * duration / (${Timeout} * 1000)"
    assert alarm["Properties"]["Threshold"] == 80


def test_concurrency_alarm_is_relative_to_the_reservation(template):
    alarm = _alarm_on(template, "AWS/Lambda", "ConcurrentExecutions")
    assert alarm["Condition"] == "HasReservedConcurrency"
    assert _metrics(alarm) == [
        ("AWS/Lambda", "ConcurrentExecutions", {"FunctionName": {"Ref": "ApiFunction"}}, "Maximum")
    ]
    assert _expression(alarm) == "100 * concurrency / ${ReservedConcurrency}"
    assert alarm["Properties"]["Threshold"] == 80


@pytest.mark.parametrize("metric_name", ["ThrottledRequests", "SystemErrors"])
def test_dynamodb_alarms_cover_every_operation_of_the_function(template, function, table_name, metric_name):
    alarm = _alarm_on(template, "AWS/DynamoDB", metric_name)
    metrics = _metrics(alarm)
    assert all(stack_table(m[2]["TableName"]) == {"Ref": table_name} and m[3] == "Sum" for m in metrics)
    (statement,) = [s for s in function["Policies"][0]["Statement"] if s.get("Sid") == "SessionItems"]
    used = {action.removeprefix("dynamodb:") for action in statement["Action"]}
    assert {m[2]["Operation"] for m in metrics} == used
    ids = [q["Id"] for q in alarm["Properties"]["Metrics"] if "MetricStat" in q]
    assert _expression(alarm) == f"SUM([{', '.join(ids)}])"
    assert alarm["Properties"]["Threshold"] == 1


def test_a_restored_table_replaces_the_stacks_everywhere(template):
    # After a point-in-time restore the functions, their roles, alarms and dashboard follow RestoredTableName:
    # every use of the stack's table sits in an Fn::If whose other branch names the restored one.
    assert template["Parameters"]["RestoredTableName"]["Default"] == ""
    bare: list[str] = []

    def walk(value, path: str, guarded: bool) -> None:
        if isinstance(value, dict):
            if "Fn::If" in value and value["Fn::If"][0] == "HasRestoredTable":
                guarded = True
            elif not guarded:
                sub = value.get("Fn::Sub")
                text = sub[0] if isinstance(sub, list) else sub
                if (
                    value.get("Ref") == "SessionsTable"
                    or (value.get("Fn::GetAtt") or [None])[0] == "SessionsTable"
                    or (isinstance(text, str) and re.search(r"\$\{SessionsTable[.}]", text))
                ):
                    bare.append(path)
            for key, item in value.items():
                walk(item, f"{path}.{key}", guarded)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]", guarded)

    for name, resource in template["Resources"].items():
        if name != "SessionsTable":
            walk(resource, name, False)
    assert bare == []
    dashboard = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"][1]
    assert dashboard["SessionsTableInUse"] == {
        "Fn::If": ["HasRestoredTable", {"Ref": "RestoredTableName"}, {"Ref": "SessionsTable"}]
    }
