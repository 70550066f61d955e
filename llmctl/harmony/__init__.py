"""OpenAI's harmony format (gpt-oss): chats rendered and outputs read through OpenAI's `openai-harmony`
package, as vLLM does for every model whose model_type is gpt_oss."""
