"""/v1/responses, the API OpenAI recommends for new work, on the chat machinery: a request is read
into the chat request it means (request.py), answered by the same engine, template, tool-call and
reasoning parsers, and written as Response objects (items.py) or Responses streaming events
(events.py). Nothing is stored: `store` is answered false and previous_response_id is refused."""
