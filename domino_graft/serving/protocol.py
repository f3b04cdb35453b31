"""The OpenAI request bodies `serve` accepts, and its error JSON.

Strict on purpose (extra="forbid", strict types): a misspelt `max_token` or a string
temperature is refused with one message naming the field, not silently ignored, so a client
never believes it set something it did not. Range checks carry the valid range in their
message. Fields that only make sense with one value here (`n`) accept only that value.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator,
                      model_validator)

# OpenAI allows up to 4 stop sequences; more would be a per-token scan for nothing
MAX_STOP = 4


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class Sampled(BaseModel):
    """What completions and chat share: the model, the budget, sampling, stops, streaming."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    max_tokens: Optional[StrictInt] = None  # None: completions 16 (OpenAI's default), chat the positions left
    # OpenAI's default is 1.0; 0 = greedy, the output then equals the target's own greedy decode
    temperature: Union[StrictFloat, StrictInt] = 1.0
    top_p: Union[StrictFloat, StrictInt] = 1.0
    top_k: StrictInt = 0  # vLLM's extension; 0 = off
    seed: Optional[StrictInt] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    n: StrictInt = 1
    user: Optional[StrictStr] = None  # accepted and ignored (OpenAI's abuse-tracking id)

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"{v} is invalid; valid: an integer >= 1 (the model's positions left bound it too)")
        return v

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v):
        if not (0.0 <= v <= 2.0):
            raise ValueError(f"{v} is invalid; valid: 0 <= temperature <= 2 (0 = greedy)")
        return float(v)

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v):
        if not (0.0 < v <= 1.0):
            raise ValueError(f"{v} is invalid; valid: 0 < top_p <= 1 (1 = off)")
        return float(v)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v):
        if v < 0:
            raise ValueError(f"{v} is invalid; valid: an integer >= 0 (0 = off)")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v):
        if v != 1:
            raise ValueError(f"{v} is invalid; valid: 1 (one choice per request; send several requests instead)")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"{len(stops)} stop sequences; valid: at most {MAX_STOP}")
        if any(s == "" for s in stops):
            raise ValueError("an empty stop sequence; valid: non-empty strings")
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(Sampled):
    # a string, or token ids (tokenizer-less targets take ids; OpenAI's token-array form)
    prompt: Union[StrictStr, list[StrictInt]]
    echo: StrictBool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("[] is empty; valid: a string or a non-empty list of token ids")
        if isinstance(v, str) and not v:
            raise ValueError("'' is empty; valid: a non-empty string or a list of token ids")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v):
        if v:
            raise ValueError("true is not supported; valid: false")
        return v


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: StrictStr
    name: Optional[StrictStr] = None


class ChatRequest(Sampled):
    messages: list[Message] = Field(...)
    max_completion_tokens: Optional[StrictInt] = None  # OpenAI's newer name for max_tokens in chat

    @field_validator("max_completion_tokens")
    @classmethod
    def _positive_too(cls, v):
        return cls._positive(v)

    @model_validator(mode="after")
    def _one_budget(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError(f"max_tokens {self.max_tokens} and max_completion_tokens "
                                 f"{self.max_completion_tokens} disagree; valid: give one of them")
            self.max_tokens = self.max_completion_tokens
        return self

    @field_validator("messages")
    @classmethod
    def _messages(cls, v):
        if not v:
            raise ValueError("[] is empty; valid: a non-empty list of {\"role\", \"content\"} messages")
        return v


# ------------------------------------------------------------------------------- errors
class APIError(Exception):
    """An error the client caused (or a full queue): its HTTP status and OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error", headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def describe_validation(errors: list[dict], model: Optional[type[BaseModel]]) -> tuple[str, Optional[str], str]:
    """pydantic's errors -> (one message naming each bad field, its value and what is valid;
    the first field's dotted path; the first error's code)."""
    parts, first_param, first_code = [], None, "invalid_value"
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        # a Union's members each report; the member name is noise to a client
        loc = [p for p in loc if not p.startswith(("list[", "str", "int", "float", "constrained"))]
        param = ".".join(loc) or "body"
        kind = e.get("type", "")
        if kind == "json_invalid":
            ctx = e.get("ctx", {}) or {}
            parts.append(f"body: malformed JSON ({ctx.get('error', 'cannot be parsed')}); valid: one JSON object")
            param, code = "body", "invalid_json"
        elif kind == "extra_forbidden":
            valid = ", ".join(sorted(_fields(model, loc))) if model is not None else "see the OpenAI API"
            parts.append(f"{param}: unknown field; valid fields: {valid}")
            code = "unknown_field"
        elif kind == "missing":
            parts.append(f"{param}: required and missing")
            code = "missing_field"
        elif kind == "model_attributes_type" or kind == "dict_type":
            parts.append(f"{param}: got {_short(e.get('input'))}; valid: a JSON object")
            code = "invalid_type"
        else:
            msg = e.get("msg", "invalid").removeprefix("Value error, ")
            got = "" if kind == "value_error" else f" (got {_short(e.get('input'))})"
            parts.append(f"{param}: {msg}{got}")
            code = "invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else "invalid_value"
        if first_param is None:
            first_param, first_code = param, code
        if param == first_param and len(parts) > 1 and kind.endswith("_type"):
            parts.pop()  # a Union's second member repeating the first's complaint about the same field
    return "; ".join(dict.fromkeys(parts)), first_param, first_code


def _fields(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The fields valid where an unknown one was given (top level, or inside messages[i] /
    stream_options)."""
    if len(loc) >= 2 and loc[0] == "messages":
        return list(Message.model_fields)
    if len(loc) >= 2 and loc[0] == "stream_options":
        return list(StreamOptions.model_fields)
    return list(model.model_fields)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
