// Starts Swagger UI on onnxpool's /docs page (a file, not an inline script, so that the
// page's Content-Security-Policy can forbid inline scripts).
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    // Relative to /docs: the server's own /openapi.json, also behind a proxy's path prefix.
    url: "openapi.json",
    dom_id: "#swagger-ui",
    // No top bar: the page documents this server, it is not a viewer for other URLs.
    layout: "BaseLayout",
    deepLinking: true,
    // The API key entered under "Authorize" survives a reload (kept in this browser only).
    persistAuthorization: true,
    displayRequestDuration: true,
    // The model, top_k and other examples from the document are filled in.
    tryItOutEnabled: false,
  });
});
