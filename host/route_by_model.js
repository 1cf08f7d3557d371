// nginx's js module (njs) routing OpenAI embeddings by the model their JSON body names, for a host
// that serves several text models (written beside the site by onnxpool; fields look like %{table}).
// The body is in memory (the location's client_body_buffer_size is the largest body allowed), and
// the internal redirect keeps it: the pool receives the request exactly as the client sent it.
var POOLS = %{table};

function route(r) {
    var model;
    try {
        model = JSON.parse(r.requestText || "").model;
    } catch (e) {
        model = undefined;
    }
    var target = typeof model === "string" ? POOLS[model] : undefined;
    if (target !== undefined) {
        r.internalRedirect(target);
        return;
    }
    var message = typeof model === "string"
        ? "The model '" + model + "' does not exist; this host serves: " + %{served}
        : "the request body must be a JSON object naming a `model`; this host serves: " + %{served};
    r.headersOut["Content-Type"] = "application/json";
    r.return(typeof model === "string" ? 404 : 400, JSON.stringify({
        error: {message: message, type: "invalid_request_error", param: "model",
                code: typeof model === "string" ? "model_not_found" : null}
    }));
}

export default {route};
